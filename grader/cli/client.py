"""`python -m grader submit` and `python -m grader status`: a student's client of the course check
service (issue 33, grader/service/app.py), for students without a GPU.

    submit --server URL [--check] FOLDER   packs FOLDER as a .zip in memory, POSTs it to
                                           URL/api/submissions, prints the id, its place in the
                                           queue and the command that follows it
    status --server URL [--wait] [ID]      GET URL/api/submissions/ID: the place in the queue,
                                           then the verdict as `make check` prints one

What it guarantees:
- **A laptop needs only Python.** The standard library's urllib and zipfile, and the grader's own
  light modules (the result's reader and `make check`'s printer): nothing imports torch, numpy or
  the service's packages. grader/__main__.py starts these two commands before the rest of the
  command line, whose modules do import torch.
- **The token is never in a process's arguments unless the student puts it there:** it comes
  from --token, --token-file or GRADER_TOKEN, in that order (`make submit TOKEN=...` passes it
  to the client through its environment).
- **Nothing is sent that the service would refuse for its size:** the folder is packed with the
  drop's own limits (config.STUDENT_ARCHIVE: bytes, files, packing ratio) and refused here, with
  its largest files named, before a byte goes out. Hidden files and folders, __pycache__, build
  outputs, links, and subfolders that are submissions of their own (another track) are left out,
  and the output says so.
- **Every refusal is the server's own reason** (its `detail`) with the HTTP status; a server that
  cannot be reached is named, with what to check.
- **No hidden case's name or shape is printed:** hidden cases show as a count of those passed
  (the service's results ought to be the students' view already; this is the client's half).

Exit codes, the same for both commands:
    0  done: submitted; or the status shown (a verdict that passed, or still in the queue)
    1  the verdict is a failure (build_error, mismatch, ...), as `make check` exits
    2  the command: a missing option, a folder that is no submission, no token
    3  the grader's own error (environment_error): not the submission's fault, as `make check`
    4  refused: by the server (its reason and HTTP status), or here, before sending, by the
       same limits
    5  the server could not be reached, or did not answer as the check service does
  130  interrupted (Ctrl-C): the submission stays in the queue; the command to resume is printed

Without an ID, `status` shows the student's newest submission, as the service lists them (GET
/api/submissions): one sent from another machine, or from the upload page, too.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import io
import ipaddress
import json
import os
import re
import socket
import ssl
import stat
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
import zipfile
from pathlib import Path

from grader import __version__
from grader.common import config
from grader.common.status import Status
from grader.course.results import SubmissionResult
from grader.course.submission import CUDA_FILE, PYTHON_FILE, read_regular
from grader.report.feedback import feedback_text

COMMANDS = ("submit", "status")
TOKEN_ENV = "GRADER_TOKEN"
SERVER_ENV = "GRADER_SERVER"
TIMEOUT_S = 120                  # one request; an upload of a few MB on a slow link fits
POLL_FIRST_S, POLL_MAX_S, POLL_BACKOFF = 5.0, 30.0, 1.5

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_MACHINE, EXIT_REFUSED, EXIT_UNREACHABLE = 0, 1, 2, 3, 4, 5
EXIT_INTERRUPTED = 130
EXIT_CODES = ("exit codes: 0 done (submitted; a verdict that passed; or still queued), 1 the "
              "verdict is a failure (as make check), 2 the command itself (an option, the folder, "
              "no token), 3 the grader's own error (not your code's), 4 refused (by the server, "
              "its reason shown; or here, before sending, by the same limits), 5 the server "
              "could not be reached, 130 interrupted (the submission stays queued)")

# Left out of an upload: what a build or an editor makes, never the submission itself.
BUILD_DIRS = frozenset({"__pycache__", "build", "results", "dist", "node_modules"})
BUILD_SUFFIXES = (".o", ".obj", ".so", ".a", ".pyc", ".pyo", ".cubin", ".fatbin", ".egg-info")
KIND_WORDS = {"check": "a check (the public cases, not ranked)",
              "submission": "a submission (every case, ranked)"}


class ClientError(Exception):
    """What stops a command: the message the student reads, and the exit code."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------------------- the command line


def add_arguments(sub) -> None:
    """The `submit` and `status` commands, on the main parser's subparsers (and this module's)."""
    s = sub.add_parser("submit", help="send a submission folder to the course check service",
                       description="Pack FOLDER (submission.cu or submission.py and what sits "
                                   "beside it) and send it to the course check service. The "
                                   "token: --token, --token-file, or GRADER_TOKEN.",
                       epilog=EXIT_CODES)
    s.add_argument("folder", type=Path, metavar="FOLDER",
                   help="the folder that holds your submission.cu or submission.py")
    s.add_argument("--check", action="store_true",
                   help="a check: the public cases only, not ranked (default: a submission, "
                        "every case, ranked)")
    _connection(s)
    t = sub.add_parser("status", help="a submission's place in the queue, then its verdict",
                       description="Show a submission's place in the course check service's "
                                   "queue, then its verdict. The token: --token, --token-file, "
                                   "or GRADER_TOKEN.", epilog=EXIT_CODES)
    t.add_argument("id", nargs="?", metavar="ID",
                   help="the id submit printed (default: your newest submission)")
    t.add_argument("--wait", action="store_true",
                   help="poll until the verdict (every 5 s, slowing to every 30 s while nothing "
                        "changes); Ctrl-C stops waiting, the submission stays queued")
    _connection(t)


def _connection(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", metavar="URL", default=os.environ.get(SERVER_ENV),
                   help=f"the service's address, https://... (default: ${SERVER_ENV})")
    p.add_argument("--token", help=f"your token (visible to others in ps: prefer --token-file "
                                   f"or ${TOKEN_ENV})")
    p.add_argument("--token-file", type=Path, metavar="FILE",
                   help="a file that holds your token (its first line)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m grader",
                                description="The course check service's client.")
    add_arguments(p.add_subparsers(dest="command", required=True))
    return p


def main(argv: list[str] | None = None) -> int:
    return command(parser().parse_args(argv))


def run() -> None:
    """The process's entry for `python -m grader submit|status` (grader/__main__.py)."""
    try:
        sys.exit(main())
    except KeyboardInterrupt:   # status --wait handles its own; this is during a request
        print("\ninterrupted: a submission being sent may or may not have arrived; `make status` "
              "(python -m grader status) shows your newest", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)


def command(args: argparse.Namespace) -> int:
    """`submit` or `status`, parsed: its exit code (the table above), every failure printed."""
    try:
        server = server_url(args.server)
        token = read_token(args.token, args.token_file)
        if args.command == "submit":
            return submit(server, token, args.folder, kind="check" if args.check else "submission")
        return status(server, token, args.id, wait=args.wait)
    except ClientError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.code


def server_url(text: str | None) -> str:
    """The service's base URL, without a trailing slash; ClientError (usage) when it is missing
    or not an http(s) address. Plain http to another machine is allowed, with a warning."""
    if not text:
        raise ClientError(f"no server: give --server https://... (make submit SERVER=...) or set "
                          f"{SERVER_ENV}; your instructor gives the address", EXIT_USAGE)
    url = urllib.parse.urlsplit(text.strip())
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ClientError(f"--server {text!r}: give the service's address as https://host[:port] "
                          f"(http:// only for this machine)", EXIT_USAGE)
    if url.scheme == "http" and not _loopback(url.hostname):
        print(f"warning: {text} is plain http: your token and code travel unencrypted; use the "
              f"https:// address if your course has one", file=sys.stderr)
    return urllib.parse.urlunsplit((url.scheme, url.netloc, url.path.rstrip("/"), "", ""))


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@dataclasses.dataclass(frozen=True)
class Token:
    """The student's token, and where it came from ('token': typed; 'env': $GRADER_TOKEN; or
    the file's path), so that a printed next command passes it the same way."""
    value: str
    source: str

    def __repr__(self) -> str:   # never in a traceback or a log
        return f"Token(source={self.source!r})"


def read_token(token: str | None, token_file: Path | None) -> Token:
    """The token from --token, else --token-file's first line, else $GRADER_TOKEN."""
    source = "token" if token is not None else str(token_file) if token_file else "env"
    if token is None and token_file is not None:
        try:
            lines = token_file.read_text().split()
        except OSError as e:
            raise ClientError(f"--token-file {token_file}: cannot read it ({e.strerror})",
                              EXIT_USAGE) from None
        token = lines[0] if lines else ""
        if not token:
            raise ClientError(f"--token-file {token_file} is empty: put your token in it",
                              EXIT_USAGE)
    if token is None:
        token = os.environ.get(TOKEN_ENV, "")
    token = token.strip()
    if not token:
        raise ClientError(f"no token: give --token-file FILE, set {TOKEN_ENV}, or --token T "
                          f"(make submit TOKEN=... or TOKEN_FILE=...); your instructor sent "
                          f"you yours", EXIT_USAGE)
    return Token(token, source)


# ---------------------------------------------------------------------------- packing a folder


@dataclasses.dataclass(frozen=True)
class Packed:
    """A submission folder as it is sent: the .zip's bytes, the files in it (relative, with their
    sizes), and what was left out with why."""
    data: bytes
    files: tuple[tuple[str, int], ...]
    left_out: tuple[tuple[str, str], ...]

    @property
    def unpacked_bytes(self) -> int:
        return sum(size for _, size in self.files)


def pack_folder(folder: Path, limits: config.ArchiveLimits = config.STUDENT_ARCHIVE) -> Packed:
    """`folder` as an in-memory .zip, files at its root, within `limits` (the drop's own, which
    the service unpacks with); ClientError (usage) for a folder that is no submission, (refused)
    over a limit, naming the largest files."""
    problem = submission_problem(folder)
    if problem:
        raise ClientError(problem, EXIT_USAGE)
    chosen, left_out = _choose_files(folder, limits.max_files)
    total = sum(size for _, _, size in chosen)
    if len(chosen) > limits.max_files or total > limits.max_bytes:
        raise ClientError(_too_large(folder, chosen, limits), EXIT_REFUSED)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        for rel, path, size in chosen:
            try:   # never through a link, never a pipe or device (submission.open_regular)
                data = read_regular(path, size + (1 << 20))
            except OSError as e:
                raise ClientError(f"{folder / rel}: cannot read it ({e.strerror or e})",
                                  EXIT_USAGE) from None
            info = zipfile.ZipInfo(rel, date_time=_zip_time(path))
            info.external_attr = 0o644 << 16   # a plain file, whatever it was here
            z.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
    data = buffer.getvalue()
    if total > limits.ratio_floor_bytes and total > limits.max_ratio * len(data):
        raise ClientError(f"{folder} packs {_size(total)} into {_size(len(data))}, more than "
                          f"{limits.max_ratio:g} to 1: the service refuses such an archive (a zip "
                          f"bomb's ratio). {_largest(chosen)}. Leave generated data out of the "
                          f"folder: a submission is its source files. Nothing was sent",
                          EXIT_REFUSED)
    return Packed(data, tuple((rel, size) for rel, _, size in chosen), tuple(left_out))


def submission_problem(folder: Path) -> str:
    """Why `folder` is not a submission folder ('' if it is): it must be a folder holding
    submission.cu or submission.py, not both (the service refuses the rest with 422)."""
    example = "for example: make submit SUBMISSION=student (python -m grader submit student)"
    if not folder.is_dir():
        if folder.name in (CUDA_FILE, PYTHON_FILE):
            return f"{folder} is a file; submit the folder that holds it: {folder.parent}"
        return f"{folder}: no such folder. Submit the folder that holds your submission, {example}"
    has_cu, has_py = (folder / CUDA_FILE).is_file(), (folder / PYTHON_FILE).is_file()
    if has_cu and has_py:
        return (f"{folder} has both {CUDA_FILE} and {PYTHON_FILE}; a submission is one of them. "
                f"Remove the one you do not want graded")
    if not (has_cu or has_py):
        return (f"{folder} has neither {CUDA_FILE} nor {PYTHON_FILE}: submit the folder that "
                f"holds yours, {example}")
    return ""


def _choose_files(folder: Path, max_files: int) -> tuple[list[tuple[str, str, int]],
                                                          list[tuple[str, str]]]:
    """(rel, path, size) of every file to send, and (rel, why) of what is left out. Entries are
    looked at with lstat only (no link followed); left-out folders are not walked; the walk stops
    past `max_files` files (the caller refuses the folder then)."""
    chosen: list[tuple[str, str, int]] = []
    left_out: list[tuple[str, str]] = []
    stack = [""]
    while stack and len(chosen) <= max_files:
        rel_dir = stack.pop()
        try:
            with os.scandir(folder / rel_dir if rel_dir else folder) as it:
                children = sorted(it, key=lambda e: e.name)
        except OSError as e:
            raise ClientError(f"{folder / rel_dir}: cannot list it ({e.strerror}); make it "
                              f"readable or move it out of the folder", EXIT_USAGE) from None
        subdirs = []
        for child in children:
            rel = f"{rel_dir}/{child.name}" if rel_dir else child.name
            try:
                st = child.stat(follow_symlinks=False)
            except OSError:
                continue   # gone since the listing
            why = _left_out(folder, rel, child.name, st.st_mode)
            if why:
                left_out.append((rel + ("/" if stat.S_ISDIR(st.st_mode) else ""), why))
            elif stat.S_ISDIR(st.st_mode):
                subdirs.append(rel)
            else:
                chosen.append((rel, child.path, st.st_size))
        stack.extend(reversed(subdirs))
    return chosen, left_out


def _left_out(folder: Path, rel: str, name: str, mode: int) -> str:
    """Why an entry is not sent ('' if it is)."""
    if name.startswith("."):
        return "hidden"
    if stat.S_ISDIR(mode):
        if name in BUILD_DIRS or name.endswith(".egg-info"):
            return "build output"
        if (folder / rel / CUDA_FILE).is_file() or (folder / rel / PYTHON_FILE).is_file():
            return "another submission folder: send it by itself"
        return ""
    if stat.S_ISLNK(mode):
        return "a link: copy the file itself into the folder if your submission needs it"
    if not stat.S_ISREG(mode):
        return "not a regular file"
    if name.endswith(BUILD_SUFFIXES):
        return "build output"
    return ""


def _zip_time(path: str) -> tuple[int, int, int, int, int, int]:
    t = time.localtime(os.lstat(path).st_mtime)
    return (max(t.tm_year, 1980), t.tm_mon, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec)


def _too_large(folder: Path, chosen: list, limits: config.ArchiveLimits) -> str:
    total = sum(size for _, _, size in chosen)
    return (f"{folder} is too large to submit: {len(chosen)} files, {_size(total)}; the course "
            f"takes at most {limits.max_files} files and {_size(limits.max_bytes)}. "
            f"{_largest(chosen)}. A submission is its source files: move data, builds and "
            f"outputs out of the folder. Nothing was sent")


def _largest(chosen: list, n: int = 5) -> str:
    top = sorted(chosen, key=lambda c: -c[2])[:n]
    return "The largest: " + ", ".join(f"{rel} ({_size(size)})" for rel, _, size in top)


def _size(n: int) -> str:
    if n < 1 << 10:
        return f"{n} B"
    if n < 1 << 20:
        return f"{n / (1 << 10):.1f} KB"
    return f"{n / (1 << 20):.1f} MB"


# ---------------------------------------------------------------------------- HTTP


@dataclasses.dataclass(frozen=True)
class Answer:
    """A 2xx answer's JSON body."""
    status: int
    body: dict


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is reported, not followed: urllib would resend a POST as a GET, bodiless."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def request(server: str, method: str, path: str, token: Token, *, body: bytes | None = None,
            content_type: str = "") -> Answer:
    """One request to the service; ClientError with the student's message for anything but a
    2xx JSON answer."""
    req = urllib.request.Request(server + path, data=body, method=method, headers={
        "Authorization": f"Bearer {token.value}", "Accept": "application/json",
        "User-Agent": f"flash-grader-client/{__version__}",
        **({"Content-Type": content_type} if content_type else {})})
    try:
        with _OPENER.open(req, timeout=TIMEOUT_S) as r:
            return Answer(r.status, _json(server, r.status, r.headers, r.read()))
    except urllib.error.HTTPError as e:
        raise _refusal(server, e) from None
    except urllib.error.URLError as e:
        raise ClientError(_unreachable(server, e.reason), EXIT_UNREACHABLE) from None
    except (TimeoutError, socket.timeout) as e:
        raise ClientError(_unreachable(server, e), EXIT_UNREACHABLE) from None
    except (OSError, ValueError) as e:   # a connection cut mid-answer, a malformed URL
        raise ClientError(_unreachable(server, e), EXIT_UNREACHABLE) from None


def _json(server: str, status: int, headers, raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        kind = headers.get("Content-Type", "no content type") if headers else "no content type"
        raise ClientError(f"{server} answered HTTP {status} with {kind}, not the check service's "
                          f"JSON: check that --server (SERVER=) is the address your instructor "
                          f"gave, https:// included", EXIT_UNREACHABLE)
    return body


def _refusal(server: str, e: urllib.error.HTTPError) -> ClientError:
    """An HTTP error status as the student reads it: the server's reason and the status."""
    try:
        raw = e.read()
    except OSError:
        raw = b""
    try:
        detail = json.loads(raw).get("detail", "")
    except (ValueError, AttributeError):
        detail = ""
    if 300 <= e.code < 400:
        where = e.headers.get("Location", "elsewhere") if e.headers else "elsewhere"
        return ClientError(f"{server} redirects to {where} (HTTP {e.code}): give that address as "
                           f"--server (SERVER=)", EXIT_UNREACHABLE)
    if not detail:
        detail = raw.decode("utf-8", "replace").strip()[:300] or e.reason or "no reason given"
    said = f"the server refused (HTTP {e.code}): {detail}"
    if e.code == 429:
        retry = (e.headers.get("Retry-After") or "").strip() if e.headers else ""
        if retry.isdigit():
            at = datetime.datetime.now() + datetime.timedelta(seconds=int(retry))
            said += f"\nTry again after {at:%H:%M} (your clock; Retry-After: {retry} s)"
    if e.code >= 500:
        return ClientError(f"{said}\nThe service itself failed: try again in a minute; if it "
                           f"keeps failing, tell your instructor", EXIT_UNREACHABLE)
    return ClientError(said, EXIT_REFUSED)


def _unreachable(server: str, reason) -> str:
    """What failed when the server could not be reached, and what to check."""
    host = urllib.parse.urlsplit(server).hostname or server
    if isinstance(reason, ConnectionRefusedError):
        return (f"cannot connect to {server}: connection refused. Check the address and port "
                f"(--server, SERVER=); if they are right, the service is not running: tell your "
                f"instructor")
    if isinstance(reason, socket.gaierror):
        return (f"cannot find the server {host} ({server}): check the spelling of --server "
                f"(SERVER=) and that this machine is online")
    if isinstance(reason, ssl.SSLCertVerificationError):
        return (f"{server}: its TLS certificate is not trusted here ({reason.verify_message}). "
                f"Check the address; if your course uses its own certificate authority, point "
                f"SSL_CERT_FILE at the file your instructor gives")
    if isinstance(reason, ssl.SSLError):
        return (f"{server}: the TLS connection failed ({reason}). Check the address: https:// "
                f"for the service's public address, http:// only if your instructor said so")
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return (f"{server} did not answer within {TIMEOUT_S} s: check the address and your "
                f"network; the service may be overloaded: try again in a few minutes")
    why = getattr(reason, "strerror", None) or str(reason)
    return f"cannot reach {server}: {why}. Check the address (--server, SERVER=) and your network"


def multipart(fields: dict[str, str], filename: str, data: bytes) -> tuple[bytes, str]:
    """(body, content type) of a multipart/form-data form: `fields`, then `file` holding data."""
    boundary = f"----flash-grader-{uuid.uuid4().hex}"
    parts = [f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"
             .encode() for name, value in fields.items()]
    parts.append(f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename="
                 f"\"{filename}\"\r\nContent-Type: application/zip\r\n\r\n".encode())
    return b"".join(parts) + data + f"\r\n--{boundary}--\r\n".encode(), \
        f"multipart/form-data; boundary={boundary}"


# ---------------------------------------------------------------------------- submit


def submit(server: str, token: Token, folder: Path, *, kind: str) -> int:
    """Pack `folder`, send it as `kind`, and print its id and what to run next."""
    packed = pack_folder(folder)
    name = re.sub(r"[^A-Za-z0-9._-]", "_", folder.absolute().name) or "submission"
    body, content_type = multipart({"kind": kind}, f"{name}.zip", packed.data)
    print(f"sending {folder}: {len(packed.files)} file(s), {_size(packed.unpacked_bytes)} "
          f"({_size(len(packed.data))} packed) to {server}", flush=True)
    if packed.left_out:
        print("  left out: " + "; ".join(f"{rel} ({why})" for rel, why in packed.left_out[:8])
              + (f"; and {len(packed.left_out) - 8} more" if len(packed.left_out) > 8 else ""))
    try:
        answer = request(server, "POST", "/api/submissions", token, body=body,
                         content_type=content_type)
    except ClientError as e:
        if "HTTP 413" in str(e):   # over the course's upload_mb, which only the server knows
            raise ClientError(f"{e}\n{_largest([(r, '', s) for r, s in packed.files])}",
                              e.code) from None
        raise
    job_id = str(answer.body.get("id", ""))
    if not job_id:
        raise ClientError(f"{server} accepted the upload but sent no id (HTTP {answer.status}): "
                          f"tell your instructor", EXIT_UNREACHABLE)
    position = answer.body.get("position")
    print(f"accepted: {KIND_WORDS.get(kind, kind)}, id {job_id}")
    print(f"place in the queue: {position}" + (" (next)" if position == 1 else "")
          if position else "place in the queue: being graded")
    print(f"follow it until its verdict:\n  {next_command(server, job_id, token)}")
    return EXIT_OK


def next_command(server: str, job_id: str, token: Token, *, wait: bool = True) -> str:
    """The exact command that follows `job_id`: `make status ...` when this ran under make (from
    the kit's folder or student/), else `python -m grader status ...`; the token passed as it was
    given: a file by its path, $GRADER_TOKEN by nothing, a typed token by a placeholder (never
    printed)."""
    if os.environ.get("MAKELEVEL"):
        how = ("" if token.source == "env" and not os.environ.get("TOKEN") else
               " TOKEN=<your token>" if token.source in ("env", "token") else
               f" TOKEN_FILE={_quote(token.source)}")
        return f"make status SERVER={_quote(server)} ID={job_id}{' WAIT=1' if wait else ''}{how}"
    how = ("" if token.source == "env" else " --token <your token>" if token.source == "token"
           else f" --token-file {_quote(token.source)}")
    return (f"python -m grader status --server {_quote(server)}{how}"
            f"{' --wait' if wait else ''} {job_id}")


def _quote(text: str) -> str:
    return text if re.fullmatch(r"[\w@%+=:,./-]+", text) else "'" + text.replace("'", "'\\''") + "'"


# ---------------------------------------------------------------------------- status


def status(server: str, token: Token, job_id: str | None, *, wait: bool,
           sleep=time.sleep) -> int:
    """Print the submission's state; with `wait`, poll until its verdict, printing each change.
    While waiting, a service that stops answering (restarted, a network hiccup) is asked again:
    an accepted submission survives a restart, so the wait goes on, saying so."""
    job_id = job_id or latest_id(server, token)
    path = f"/api/submissions/{urllib.parse.quote(job_id, safe='')}"
    shown, delay, outage = "", POLL_FIRST_S, ""
    try:
        while True:
            try:
                body = request(server, "GET", path, token).body
            except ClientError as e:
                if not (wait and shown and e.code == EXIT_UNREACHABLE):
                    raise
                if not outage:
                    print(f"the service is not answering ({str(e).splitlines()[0]}); still "
                          f"waiting: your submission stays in its queue", file=sys.stderr,
                          flush=True)
                outage = str(e)
                sleep(delay)
                delay = min(POLL_MAX_S, delay * POLL_BACKOFF)
                continue
            if outage:
                print("the service answers again", file=sys.stderr, flush=True)
                outage = ""
            if body.get("state") == "done":
                return show_verdict(body)
            line = queue_line(body)
            if not wait:
                print(line)
                print(f"for its verdict as soon as it is graded: "
                      f"{next_command(server, job_id, token)}")
                return EXIT_OK
            if line != shown:
                print(line, flush=True)
                delay = POLL_FIRST_S if shown else delay   # the queue moves: look again soon
                shown = line
            sleep(delay)
            delay = min(POLL_MAX_S, delay * POLL_BACKOFF)
    except KeyboardInterrupt:
        print(f"\nstopped waiting: the submission stays in the queue. To follow it again:\n  "
              f"{next_command(server, job_id, token)}", file=sys.stderr)
        return EXIT_INTERRUPTED


def latest_id(server: str, token: Token) -> str:
    """The id of the student's newest submission (GET /api/submissions, newest first)."""
    mine = request(server, "GET", "/api/submissions", token).body.get("submissions")
    if not isinstance(mine, list):
        raise ClientError(f"{server} did not list your submissions: give the id submit printed",
                          EXIT_UNREACHABLE)
    if not mine:
        raise ClientError(f"you have no submission on {server} yet: make submit SERVER=... "
                          f"sends one", EXIT_USAGE)
    return str(mine[0].get("id", ""))


def queue_line(body: dict) -> str:
    """'queued: place 3 in the queue; a check, received 10:31 UTC' or 'running: ...'."""
    received = str(body.get("received_at", ""))[11:16]
    tail = f"; a {body.get('kind')}" + (f", received {received} UTC" if received else "")
    if body.get("state") == "running":
        return f"running: being graded on the course GPU now{tail}"
    position = body.get("position")
    return f"queued: place {position} in the queue{' (next)' if position == 1 else ''}{tail}"


def show_verdict(body: dict) -> int:
    """Print a done submission's result as `make check` prints one; its exit code (as `make
    check`'s). The service sends a student the students' view (worker.student_view: `feedback`,
    the text `make check` prints, and `hidden_cases`, a count); a full result (the instructor's
    token) is printed the same way, its hidden cases counted here."""
    kind = str(body.get("kind"))
    print(f"graded: {KIND_WORDS.get(kind, kind)}, id {body.get('id')}")
    result = body.get("result")
    if not isinstance(result, dict):
        print("the service recorded no result for it: tell your instructor (give them the id)")
        return EXIT_MACHINE
    try:
        r = SubmissionResult.from_dict(result)
    except (KeyError, ValueError, TypeError, AttributeError):
        return _plain_summary(result)
    shown, hidden = students_view(r)
    text = result.get("feedback")
    print(text if isinstance(text, str) and text else feedback_text(shown))
    counted = result.get("hidden_cases")
    if isinstance(counted, dict) and counted.get("of"):
        print(_hidden_line(counted.get("passed", 0), counted.get("ran", counted["of"]),
                           counted["of"], kind))
    elif hidden:
        ran = [c for c in hidden if c.status is not Status.NOT_RUN]
        print(_hidden_line(sum(c.status is Status.PASS for c in ran), len(ran), len(hidden),
                           kind))
    return verdict_code(r.status)


def _hidden_line(passed: int, ran: int, of: int, kind: str) -> str:
    """The hidden cases as a count: never a name, a shape or a message."""
    if not ran:
        why = ": a check runs the public cases only" if kind == "check" else ""
        return f"\nHidden cases: {of}, not run{why}"
    return (f"\nHidden cases: {passed} of {of} passed"
            + (f" ({of - ran} not run)" if ran < of else "") + "; their details are not shown")


def students_view(r: SubmissionResult) -> tuple[SubmissionResult, tuple]:
    """`r` without its hidden cases (returned apart, to count) and with a hidden timed case
    unnamed: nothing printed names a hidden case or its shape."""
    hidden = tuple(c for c in r.cases if c.hidden)
    names = {c.case for c in hidden}
    timed = "a hidden case" if r.timed_case in names else r.timed_case
    return dataclasses.replace(r, cases=tuple(c for c in r.cases if not c.hidden),
                               timed_case=timed), hidden


def verdict_code(s: Status) -> int:
    """The exit code `make check` gives the same verdict."""
    if s in (Status.ENVIRONMENT_ERROR, Status.NO_RESULT):
        return EXIT_MACHINE
    return EXIT_OK if s in (Status.PASS, Status.NOT_RUN) else EXIT_FAILED


def _plain_summary(result: dict) -> int:
    """A result this grader cannot read as a SubmissionResult (a newer grader's): its status,
    message, public cases and hint, as given."""
    word = str(result.get("status", "unknown"))
    print(f"{result.get('label', 'result')}: {word.upper()}")
    if result.get("message"):
        print(f"  {result['message']}")
    public = [c for c in result.get("cases") or () if isinstance(c, dict) and not c.get("hidden")]
    if public:
        print("\nCases:")
        for c in public:
            print(f"  {str(c.get('status', '?')):14} {c.get('case', '?')}")
    if result.get("hint"):
        print(f"\nHint: {result['hint']}")
    try:
        return verdict_code(Status(word))
    except ValueError:
        return EXIT_FAILED

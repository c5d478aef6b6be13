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

Its connection (the address, the token, one request, the upload's body) is client_http.py; packing
the folder, client_pack.py.

Without an ID, `status` shows the student's newest submission, as the service lists them (GET
/api/submissions): one sent from another machine, or from the upload page, too.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from grader.common.status import Status
from grader.course.results import SubmissionResult
from grader.cli.client_http import (EXIT_FAILED, EXIT_INTERRUPTED, EXIT_MACHINE, EXIT_OK,
                                    EXIT_UNREACHABLE, EXIT_USAGE, SERVER_ENV, TOKEN_ENV,
                                    ClientError, Token, multipart, read_token, request, server_url)
from grader.cli.client_pack import human_size, largest, pack_folder
from grader.report.feedback import feedback_text

COMMANDS = ("submit", "status")
POLL_FIRST_S, POLL_MAX_S, POLL_BACKOFF = 5.0, 30.0, 1.5
EXIT_CODES = ("exit codes: 0 done (submitted; a verdict that passed; or still queued), 1 the "
              "verdict is a failure (as make check), 2 the command itself (an option, the folder, "
              "no token), 3 the grader's own error (not your code's), 4 refused (by the server, "
              "its reason shown; or here, before sending, by the same limits), 5 the server "
              "could not be reached, 130 interrupted (the submission stays queued)")
KIND_WORDS = {"check": "a check (the public cases, not ranked)",
              "submission": "a submission (every case, ranked)"}


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


# ---------------------------------------------------------------------------- submit


def submit(server: str, token: Token, folder: Path, *, kind: str) -> int:
    """Pack `folder`, send it as `kind`, and print its id and what to run next."""
    packed = pack_folder(folder)
    name = re.sub(r"[^A-Za-z0-9._-]", "_", folder.absolute().name) or "submission"
    body, content_type = multipart({"kind": kind}, f"{name}.zip", packed.data)
    print(f"sending {folder}: {len(packed.files)} file(s), {human_size(packed.unpacked_bytes)} "
          f"({human_size(len(packed.data))} packed) to {server}", flush=True)
    if packed.left_out:
        print("  left out: " + "; ".join(f"{rel} ({why})" for rel, why in packed.left_out[:8])
              + (f"; and {len(packed.left_out) - 8} more" if len(packed.left_out) > 8 else ""))
    try:
        answer = request(server, "POST", "/api/submissions", token, body=body,
                         content_type=content_type)
    except ClientError as e:
        if "HTTP 413" in str(e):   # over the course's upload_mb, which only the server knows
            raise ClientError(f"{e}\n{largest([(r, '', s) for r, s in packed.files])}",
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

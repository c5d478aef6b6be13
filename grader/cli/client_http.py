"""The check service's client, its connection (issue 33, grader/cli/client.py): the service's
address, the student's token, one request with every failure turned into the student's message
(the server's own reason and HTTP status; a server that cannot be reached named, with what to
check; redirects reported, never followed with the upload dropped), and the multipart body of an
upload. The standard library only."""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import json
import os
import socket
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

from grader import __version__

TOKEN_ENV = "GRADER_TOKEN"
SERVER_ENV = "GRADER_SERVER"
TIMEOUT_S = 120                  # one request; an upload of a few MB on a slow link fits

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_MACHINE, EXIT_REFUSED, EXIT_UNREACHABLE = 0, 1, 2, 3, 4, 5
EXIT_INTERRUPTED = 130


class ClientError(Exception):
    """What stops a command: the message the student reads, and the exit code."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


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

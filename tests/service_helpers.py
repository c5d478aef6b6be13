"""What the check service's tests share (issue 33): a free loopback port, a server process started
and waited for until its port answers, and a multipart upload as `make submit` sends one."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(script: str, port: int, *, timeout_s: float = 180) -> subprocess.Popen:
    """`script` (Python source that serves on `port`) in a process of its own, once its port
    answers; its output (stdout and stderr) in the AssertionError when it exits or never answers
    (a loaded 2-core machine takes seconds to import the stack)."""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    wait_for_port(proc, port, timeout_s)
    return proc


def wait_for_port(proc: subprocess.Popen, port: int, timeout_s: float = 180) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None:
                raise AssertionError(proc.stdout.read() if proc.stdout else proc.returncode)
            time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"the service did not start within {timeout_s:.0f} s")


def multipart(kind: str, data: bytes, filename: str = "upload.zip") -> tuple[bytes, dict]:
    """The body and headers of an upload: fields `kind` and `file`."""
    boundary = uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"kind\"\r\n\r\n{kind}\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            f"filename=\"{filename}\"\r\nContent-Type: application/zip\r\n\r\n").encode() \
        + data + f"\r\n--{boundary}--\r\n".encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}

"""Lines on a control pipe, read the same way by the trusted side and the subject."""

from __future__ import annotations

import os


def read_line(fd: int, limit: int = 4096) -> str:
    """One line from a control pipe, byte by byte (nothing after it is taken), stripped; '' at
    the pipe's end."""
    got = b""
    while len(got) < limit and not got.endswith(b"\n"):
        byte = os.read(fd, 1)
        if not byte:
            break
        got += byte
    return got.decode(errors="replace").strip()

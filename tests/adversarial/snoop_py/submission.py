"""Adversarial, threat 5: looks for what it must not read (the solution, hidden cases, other
submissions, results) anywhere on the filesystem, and for the network. If it finds anything it
fails loudly with LEAK; in the sandbox it finds nothing and computes honestly (pass)."""
import os
import socket
from pathlib import Path

from honest_flash import custom_kernel as honest

HERE = Path(__file__).resolve().parent
SYSTEM = {"proc", "sys", "dev", "usr", "lib", "lib32", "lib64", "bin", "sbin", "etc", "boot", "run",
          "var", "snap", "libx32"}


def _secrets(limit: int = 300_000) -> list[str]:
    found, seen = [], 0
    for top in sorted(os.listdir("/")):
        if top in SYSTEM:
            continue
        for root, dirs, files in os.walk("/" + top):
            dirs[:] = [d for d in dirs if d not in ("site-packages", "dist-packages", "node_modules", ".git")]
            seen += len(files)
            for f in files:
                path = Path(root) / f
                if path.parent == HERE or "/grader/" in str(path):
                    continue   # its own folder; the grader's code (grader/course/submission.py)
                if (f in ("hidden.txt", "_run.json") or f in ("submission.cu", "submission.py")
                        or (f.endswith(".json") and path.parent.name == "results")):
                    found.append(str(path))
            if seen > limit or len(found) > 5:
                return found
    return found


def _network() -> list[str]:
    reached = []
    for host in (("1.1.1.1", 53), ("8.8.8.8", 53), ("pypi.org", 443)):
        try:
            socket.create_connection(host, timeout=2).close()
            reached.append(f"{host[0]}:{host[1]}")
        except OSError:
            pass
    return reached


LEAKS = _secrets() + _network()
if LEAKS:
    raise RuntimeError(f"LEAK: could read or reach {LEAKS[:5]}")


def custom_kernel(data):
    return honest(data)

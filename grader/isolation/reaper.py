"""The run's reaper: a small process that outlives the grader by a moment, so that no way the
grader ends (Ctrl-C, a crash, `kill -9`) leaves a child compiling or a scratch file behind.

The grader starts it with a pipe on its stdin and tells it every process group it starts
("+<pgid>") and reaps ("-<pgid>"). When the pipe closes, because the grader exited or was
killed (the kernel closes a dead process's files), the reaper kills every group it still knows,
then every process that carries the run's token in its environment (a stray that left its
group), and removes the run's scratch folder. Each direct child also dies with the grader by
PR_SET_PDEATHSIG (grader/isolation/procs.py); the reaper covers their children (ninja, nvcc, cicc, the
subject under the harness).

    python -m grader.isolation.reaper TOKEN SCRATCH_DIR
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time

TOKEN_ENV = "GRADER_RUN_TOKEN"   # grader.isolation.procs.RUN_TOKEN_ENV (not imported: this starts fast)


def carriers(token: str, variable: str = TOKEN_ENV) -> list[int]:
    """Pids of the other processes whose environment holds variable=token (readable ones only;
    zombies have none)."""
    needle = f"{variable}={token}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            continue
    return found


def sweep(groups: set[int], token: str, *, rounds: int = 10) -> None:
    """Kill `groups`, then every carrier of `token` and its group, until none is left."""
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for _ in range(rounds):
        pids = carriers(token) if token else []
        if not pids:
            return
        for pid in pids:
            for kill in (lambda: os.killpg(os.getpgid(pid), signal.SIGKILL),
                         lambda: os.kill(pid, signal.SIGKILL)):
                try:
                    kill()
                except (ProcessLookupError, PermissionError, OSError):
                    pass
        time.sleep(0.2)


def main(argv: list[str]) -> int:
    token, scratch = argv[0], argv[1]
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)   # a Ctrl-C is the grader's to handle, not ours
    groups: set[int] = set()
    for line in sys.stdin.buffer:            # until the grader's end closes, however it ended
        op, number = line[:1], line[1:].strip()
        if number.isdigit():
            (groups.add if op == b"+" else groups.discard)(int(number))
    sweep(groups, token)
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

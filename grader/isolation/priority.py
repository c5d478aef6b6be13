"""Builds at a lower CPU priority than the GPU stages' preparations (issue 32): lower_priority in
the child before it runs its command (procs.spawn_capped's `nice`), and again inside the sandbox
(lowered: bubblewrap's --new-session puts the command in a session of its own).

Run as `python priority.py NICE -- CMD...` (lowered's prefix) it lowers its own priority and
execs CMD. Only the standard library: it runs in the sandbox before the command, with -I.

Why both a process's nice and its session's: where the kernel groups processes by session for
scheduling (autogroup: /proc/sys/kernel/sched_autogroup_enabled on, the process in no cpu
cgroup of its own), the CPU is shared between sessions first, and a process's nice weighs only
against the processes of its own session; every child of the grader has a session of its own
(start_new_session). Elsewhere (a container's cpu cgroup, autogroup off) the process's nice is
what counts. The session's nice is not a boundary: a build's code could set it back to 0 (the
kernel lets a process raise its session's priority up to 0, not its own), and gain only a fair
share of the build CPUs, never the GPU stages' (they have CPUs of their own: cpus.split_cpus).
"""

from __future__ import annotations

import os
import sys
import time

AUTOGROUP = "/proc/self/autogroup"
# The kernel takes a session's nice at most once every 100 ms machine-wide from an unprivileged
# process (EAGAIN otherwise): a dozen builds started at once wait their turn, this long at most.
AUTOGROUP_TRY_S = 3.0


def lower_priority(nice: int) -> int:
    """The calling process, and what it starts from now on, at nice `nice` at least (never
    higher a priority than it had: a grader started with `nice` keeps its builds there), and its
    session's scheduling group at the same nice where the kernel has one (the module's
    docstring). The same twice is the same as once. Returns the process's nice now."""
    now = os.nice(max(0, min(nice, 19) - os.nice(0)))
    deadline = time.monotonic() + AUTOGROUP_TRY_S
    while True:
        try:
            with open(AUTOGROUP, "w") as group:
                group.write(str(now))
            return now
        except BlockingIOError:   # EAGAIN: another session's nice was set in the last 100 ms
            if time.monotonic() > deadline:
                return now
            time.sleep(0.03)
        except OSError:   # no autogroup in this kernel: the process's nice is what counts
            return now


def lowered(cmd: list[str], nice: int) -> list[str]:
    """`cmd` run by this module at `nice` (sandbox.Sandbox.wrap's `nice`); `cmd` if nice is 0."""
    if nice <= 0:
        return list(cmd)
    return [sys.executable, "-I", os.path.abspath(__file__), str(int(nice)), "--", *cmd]


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "--":
        sys.exit("usage: priority.py NICE -- CMD...")
    lower_priority(int(argv[0]))
    os.execvp(argv[2], argv[2:])


if __name__ == "__main__":
    main(sys.argv[1:])

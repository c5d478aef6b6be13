"""Processes by pid: a process's tree of descendants, when each started (telling it from a later
process given the same pid), killing what left its group, waiting for it to exit, and the
orphans a subreaper adopts: how a subject and all it started are ended (grader/trusted/harness.py)."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

from grader.isolation.procs import kill_group


def process_tree(root: int) -> set[int]:
    """`root` and every process descended from it (host pids, from /proc)."""
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in tree:
            continue
        tree.add(pid)
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return tree


def started_at(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot, /proc/PID/stat's 22nd field), telling it from
    a later process given the same pid; None when it has exited: every thread of it ended (a
    zombie has let go of its files, and so of any GPU context). A leader that ended its own
    thread while others run (pthread_exit) shows as a zombie: its threads are looked at too."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        if fields[0] in ("Z", "X"):
            tasks = os.listdir(f"/proc/{pid}/task")
            if not any(_task_state(pid, t) not in ("Z", "X", None) for t in tasks):
                return None
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _task_state(pid: int, task: str) -> str | None:
    try:
        return Path(f"/proc/{pid}/task/{task}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def wait_exited(pids: set[int], timeout_s: float) -> set[int]:
    """Up to timeout_s for each of `pids` (as they are now) to exit; those still running then."""
    alive = {pid: started_at(pid) for pid in pids}
    deadline = time.monotonic() + timeout_s
    while True:
        alive = {pid: t for pid, t in alive.items() if t is not None and started_at(pid) == t}
        if not alive or time.monotonic() > deadline:
            return set(alive)
        time.sleep(0.05)


def kill_tree(pids: dict[int, int | None]) -> None:
    """SIGKILL each of `pids` (pid: started_at, as taken before) that is still that process: what
    left its parent's process group (setsid) dies too. A pid since given to another process is
    left alone."""
    for pid, started in pids.items():
        if started is not None and started_at(pid) == started:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


_SUBREAPER = [False]


def become_subreaper() -> None:
    """This process adopts the orphans among its descendants (prctl PR_SET_CHILD_SUBREAPER): a
    process that a subject started and then left (a double fork) stays in this one's
    process_tree, where closing it finds it; without a sandbox's PID namespace it would go to
    init. For a process of its own (the harness's main); Linux only, elsewhere nothing."""
    try:
        _SUBREAPER[0] = ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        pass


def adopted() -> set[int]:
    """The children this process adopted as a subreaper, with all they started; none unless it
    became one (become_subreaper: a process used for nothing else)."""
    if not _SUBREAPER[0]:
        return set()
    me = os.getpid()
    return process_tree(me) - {me}


def end_processes(proc: subprocess.Popen, tree: dict[int, int | None], *,
                  find: Callable[[], dict[int, int | None]] | None = None,
                  timeout_s: float = 30) -> set[int]:
    """`proc`'s process group killed, then each of `tree` (pid: started_at, taken before any of
    it was told to end) by pid: what left the group (setsid) dies too. `find`, when given, is
    asked again for the processes it counts (a subreaper's adopted orphans: become_subreaper),
    up to 3 rounds, for what was started while the kill went on. Then up to timeout_s for each
    to exit (grader/schedule/gate.py: none that ran submission code may hold a CUDA context once the next
    time stage can begin); those still running then are returned, for the caller to say."""
    kill_group(proc)
    for _ in range(3):
        kill_tree(tree)
        later = find() if find is not None else {}
        if later.keys() <= tree.keys():
            break
        tree.update(later)
    return wait_exited(set(tree), timeout_s=timeout_s)

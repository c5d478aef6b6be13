"""A student's check's build, followed while it runs (BuildWatch): the phase its compiler is in,
read from the build's process tree in /proc (build_phase, BUILD_PHASES), reported every few
seconds as a progress line and kept for a timeout's message.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Iterable, Sequence

from grader.build.messages import StudentCheck, progress_line
from grader.common import config
from grader.course.submission import Kind, Submission
from grader.isolation.tree import process_tree


# What a student's check shows while it compiles. nvcc prints nothing until it ends, and the
# build's output goes to its log, so the phase is read from the processes the build runs (its
# process tree, in /proc): nvcc runs one tool after another for a .cu file (the preprocessor,
# cudafe++, cicc, ptxas, fatbinary, the host compiler); torch's ninja build (with a GPU) runs nvcc
# on cuda.cu beside c++ on main.cpp, then links. Each tool's process name, and the phase it is.
_TOOL_PHASES = {
    "cudafe++": "front end (cudafe++)", "cicc": "device code (cicc)", "ptxas": "ptxas",
    "fatbinary": "fatbinary", "nvlink": "device link (nvlink)", "as": "host compiler",
    "collect2": "link", "ld": "link", "ld.bfd": "link", "ld.gold": "link", "ld.lld": "link",
    "mold": "link",
}
# Host compilers proper (gcc's cc1plus, also nvcc's preprocessor when given -E).
_HOST_COMPILERS = ("cc1plus", "cc1")
# In the order a build goes through them; a driver alone (between its tools) says where it is.
BUILD_PHASES = ("preprocessor", "front end (cudafe++)", "device code (cicc)", "ptxas", "fatbinary",
                "host compiler", "device link (nvlink)", "link")
_DRIVER_PHASES = {"nvcc": "nvcc", "ninja": "ninja"}
# Python alone in the build's tree: before any tool ran (the build child loads torch), or after
# (it loads or audits what was compiled).
STARTING = "starting (Python, torch)"
AFTER_COMPILE = "after the compile (Python)"


def build_phase(processes: Iterable[tuple[str, Sequence[str]]]) -> str:
    """The phase a build is in, from its running processes, each (name, argv) as /proc gives them
    (comm, cmdline): the tools' phases in BUILD_PHASES order, joined by ' + ' when several run at
    once; else the driver that runs between them (nvcc, ninja); else 'starting (Python, torch)'
    while only Python runs (the build child loads torch); '' when nothing is known."""
    tools, drivers, python = set(), set(), False
    for name, argv in processes:
        names = {name, os.path.basename(argv[0]) if argv else ""}
        if names & set(_HOST_COMPILERS):
            tools.add("preprocessor" if "-E" in argv else "host compiler")
        elif names & set(_TOOL_PHASES):
            tools.update(_TOOL_PHASES[n] for n in names & set(_TOOL_PHASES))
        elif names & set(_DRIVER_PHASES):
            drivers.update(_DRIVER_PHASES[n] for n in names & set(_DRIVER_PHASES))
        elif any(n.startswith("python") for n in names):
            python = True
    if tools:
        return " + ".join(p for p in BUILD_PHASES if p in tools)
    if drivers:
        return " + ".join(sorted(drivers))
    return STARTING if python else ""


def following(phase: str, seen: str) -> str:
    """`phase` as the watch says it, `seen` being the phase it said last: Python alone after a
    tool or driver ran is AFTER_COMPILE, not STARTING (a compile that ended within the limit,
    then the build child's own work)."""
    if phase == STARTING and seen not in ("", STARTING):
        return AFTER_COMPILE
    return phase


def _running(root: int) -> list[tuple[str, list[str]]]:
    """(comm, argv) of `root` and every process under it, as /proc shows them now."""
    found = []
    for pid in process_tree(root):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:   # it ended meanwhile
            continue
        found.append((name, [a.decode(errors="replace") for a in argv if a]))
    return found


class BuildWatch:
    """Follows one build of a student's check while it runs: every second, the phase its
    processes are in (build_phase), kept for the timeout's message; every `check.every_s`
    seconds, a progress_line to `check.report`."""

    SAMPLE_S = 1.0

    def __init__(self, sub: Submission, limits: config.Limits, check: StudentCheck):
        self.check = check
        self.what = "import" if sub.kind is Kind.PYTHON else "compile"
        self.limit_s = limits.import_s if sub.kind is Kind.PYTHON else limits.build_s
        self.source_name = sub.source.name if sub.source is not None else "submission"
        self.phase = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def hooks(self, inner: dict) -> dict:
        """procs.run_limited's `started` and `ended`: `inner`'s (the quota's), and this watch
        from the moment the build starts until it ends."""
        def started(pid: int) -> None:
            inner["started"](pid)
            self._stop.clear()
            self.phase = ""
            self._thread = threading.Thread(target=self._follow, args=(pid,), daemon=True,
                                            name="build-watch")
            self._thread.start()

        def ended(pid: int) -> None:
            self._stop.set()
            if self._thread is not None:
                self._thread.join(timeout=10)
            inner["ended"](pid)
        return dict(started=started, ended=ended)

    def _follow(self, pid: int) -> None:
        t0 = last = time.monotonic()
        while not self._stop.wait(self.SAMPLE_S):
            phase = following(build_phase(_running(pid)), self.phase) if self.what == "compile" else ""
            now = time.monotonic()
            # (an import runs Python alone: it has no phases). Near the limit the build is being
            # killed: a sample then sees its tools gone and their driver still there.
            if phase and now - t0 < self.limit_s - self.SAMPLE_S / 2:
                self.phase = phase
            if self.check.report is not None and now - last >= self.check.every_s - 0.05:
                last = now
                try:
                    self.check.report(progress_line(self.what, self.source_name, self.phase,
                                                    now - t0, self.limit_s))
                except (OSError, ValueError):   # the display is gone (a closed stderr)
                    pass

"""Run a child process with a wall-clock limit and capped output, killing its whole group.

A submission can hang, sleep, or print gigabytes; the grader must survive all three. Output is
read through a pipe as it comes: the first `head` and last `tail` bytes are kept, the rest is
counted and dropped, so nothing unbounded reaches memory or disk. Which CPUs a child may run
on: grader/isolation/cpus.py; a process tree found and ended by pid: grader/isolation/tree.py.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import re
import resource
import signal
import subprocess
import threading
import time
from typing import Callable, Iterable

from grader.common import config
from grader.common.text import clean
from grader.isolation.cpus import _cpu_list
from grader.isolation.priority import lower_priority

# Every child of a grading run carries this variable (its value: the run's token), so the run's
# reaper (grader/isolation/reaper.py) can find a stray that left its process group, and tests can look
# for orphans in /proc/<pid>/environ.
RUN_TOKEN_ENV = "GRADER_RUN_TOKEN"
PR_SET_PDEATHSIG = 1
# Loaded before any fork: the child, between fork and exec, only calls prctl through it.
_LIBC = ctypes.CDLL(None, use_errno=True)


class Cancelled(RuntimeError):
    """The run is stopping (Ctrl-C, SIGTERM): no new child process starts."""


class _Children:
    """The live children of this process (each the leader of its own process group), so that
    a Ctrl-C kills all of them at once and a watcher (the run's reaper) always knows them."""

    def __init__(self):
        self.lock = threading.Lock()
        self.live: dict[int, subprocess.Popen] = {}
        self.cancelled = threading.Event()
        self.watch: Callable[[str, int], None] | None = None   # ('+' | '-', pgid)
        self.token = ""

    def add(self, proc: subprocess.Popen) -> None:
        with self.lock:
            self.live[proc.pid] = proc
            if self.watch:
                self.watch("+", proc.pid)

    def remove(self, proc: subprocess.Popen) -> None:
        with self.lock:
            if self.live.pop(proc.pid, None) is not None and self.watch:
                self.watch("-", proc.pid)


CHILDREN = _Children()


def cancel_all() -> int:
    """Stop the run's children: nothing new starts, every live process group is killed (their
    waiting threads then return at once). Returns how many groups were killed."""
    CHILDREN.cancelled.set()
    with CHILDREN.lock:
        pids = list(CHILDREN.live)
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return len(pids)


def stopping() -> bool:
    """Whether the run is stopping (cancel_all): a child that ended now was most likely killed."""
    return CHILDREN.cancelled.is_set()


def start_run(token: str, watch: Callable[[str, int], None] | None = None) -> None:
    """A new run: children may start again, carry `token` in RUN_TOKEN_ENV, and are reported to
    `watch` as they start and end."""
    with CHILDREN.lock:
        CHILDREN.cancelled.clear()
        CHILDREN.token, CHILDREN.watch = token, watch
        for pid in CHILDREN.live:
            if watch:
                watch("+", pid)


def end_run() -> None:
    """The run is over (its children killed): children may start again, unwatched."""
    with CHILDREN.lock:
        CHILDREN.token, CHILDREN.watch = "", None
        CHILDREN.cancelled.clear()


@dataclasses.dataclass(frozen=True)
class ProcResult:
    returncode: int | None       # None when it was killed for running too long
    timed_out: bool
    elapsed_s: float
    output: str                  # head + '[... N bytes dropped ...]' + tail
    output_bytes: int            # how much it printed in all

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.returncode == 0

    @property
    def signal_name(self) -> str | None:
        """The signal that ended the process: a negative return code, or 128 + N when it went
        through a sandbox or shell, which report their child's death that way."""
        rc = self.returncode
        number = -rc if rc is not None and rc < 0 else (rc - 128 if rc is not None and 128 < rc < 160 else None)
        if number is not None:
            try:
                return signal.Signals(number).name
            except ValueError:
                return f"signal {number}"
        return None

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.output.rstrip().splitlines()[-lines:])

    def last_exception(self) -> str:
        return last_exception_line(self.output)


def last_exception_line(text: str) -> str:
    """'ValueError: ...', the line that closes a Python traceback, or ''."""
    for line in reversed(text.splitlines()):
        if re.match(r"^\w+(\.\w+)*(Error|Exception|Interrupt)\b", line):
            return line.strip()
    return ""


class _CappedReader(threading.Thread):
    def __init__(self, stream, head: int, tail: int):
        super().__init__(daemon=True)
        self.stream, self.head_cap, self.tail_cap = stream, head, tail
        self.head, self.tail, self.total = bytearray(), bytearray(), 0

    def run(self) -> None:
        for chunk in iter(lambda: self.stream.read1(65536), b""):
            self.total += len(chunk)
            room = self.head_cap - len(self.head)
            if room > 0:
                self.head += chunk[:room]
                chunk = chunk[room:]
            self.tail += chunk
            if len(self.tail) > self.tail_cap:
                del self.tail[:len(self.tail) - self.tail_cap]

    def text(self) -> str:
        dropped = self.total - len(self.head) - len(self.tail)
        middle = f"\n[... {dropped} bytes of output dropped ...]\n" if dropped > 0 else ""
        # A submission's bytes: made valid UTF-8 with control characters visible, here, once.
        return clean(bytes(self.head).decode(errors="replace") + middle
                     + bytes(self.tail).decode(errors="replace"), limit=1 << 22)


def spawn_capped(cmd: list[str], *, env: dict | None = None, cwd: str | os.PathLike | None = None,
                 head_bytes: int = 8192, tail_bytes: int = 24576, memory_bytes: int | None = None,
                 file_bytes: int | None = None, pass_fds: tuple[int, ...] = (),
                 cpus: Iterable[int] | None = None, nice: int = 0
                 ) -> tuple[subprocess.Popen, "_CappedReader"]:
    """Start `cmd` in a new session with stdout and stderr merged into a capped reader.
    `memory_bytes` caps the address space of it and its children (not for CUDA processes: the
    driver maps far more virtual memory than it uses); `file_bytes` caps any file they write;
    `pass_fds` stay open in the child; `cpus` (a CpuSplit's, among this process's own CPUs)
    are the only CPUs it and everything it starts may run on; `nice` > 0: it and everything it
    starts run at that nice, their session too (priority.lower_priority): they yield the CPUs
    to the grader's other children."""

    parent = os.getpid()
    pin = None
    if cpus is not None:   # checked here: the child could only fail with a bare SubprocessError
        pin, allowed = frozenset(cpus), os.sched_getaffinity(0)
        if not pin or not pin <= allowed:
            raise ValueError(f"cpus must be a non-empty subset of this process's CPUs "
                             f"{_cpu_list(tuple(sorted(allowed)))}; got {sorted(pin)}")

    def prepare_child() -> None:
        # The child dies with the thread that started it, even by kill -9 (its own children are
        # in its process group, which the reaper and cancel_all kill).
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:   # the parent died before prctl took effect
            os._exit(1)
        if pin is not None:   # before exec: nothing of the command runs elsewhere, and every
            os.sched_setaffinity(0, pin)   # process it starts (bubblewrap's too) inherits it
        if memory_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        if file_bytes:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
        if nice > 0:
            lower_priority(nice)

    if CHILDREN.cancelled.is_set():
        raise Cancelled("the run is stopping: no new process is started")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env, cwd=cwd, start_new_session=True,
                            preexec_fn=prepare_child, pass_fds=pass_fds)
    CHILDREN.add(proc)
    if CHILDREN.cancelled.is_set():   # cancelled while it started: cancel_all may have missed it
        kill_group(proc)
        raise Cancelled("the run is stopping: no new process is started")
    reader = _CappedReader(proc.stdout, head_bytes, tail_bytes)
    reader.start()
    return proc, reader


def run_limited(cmd: list[str], *, timeout_s: float, env: dict | None = None,
                cwd: str | os.PathLike | None = None, head_bytes: int = 8192,
                tail_bytes: int = 24576, memory_bytes: int | None = None,
                file_bytes: int | None = None, cpus: Iterable[int] | None = None,
                nice: int = 0, started: Callable[[int], None] | None = None,
                ended: Callable[[int], None] | None = None) -> ProcResult:
    """Run `cmd` in a new session with a wall-clock limit; output merged and capped, `cpus` the
    only CPUs it runs on, `nice` its CPU priority (spawn_capped). `started(pid)` once it runs
    and `ended(pid)` once its group is killed (grader/isolation/quota.py: the folder it writes)."""
    start = time.monotonic()
    proc, reader = spawn_capped(cmd, env=env, cwd=cwd, head_bytes=head_bytes,
                                tail_bytes=tail_bytes, memory_bytes=memory_bytes,
                                file_bytes=file_bytes, cpus=cpus, nice=nice)
    timed_out = False
    try:
        if started is not None:
            started(proc.pid)
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        kill_group(proc)
        if ended is not None:
            ended(proc.pid)
    reader.join(timeout=10)
    return ProcResult(returncode=None if timed_out else proc.returncode, timed_out=timed_out,
                      elapsed_s=time.monotonic() - start, output=reader.text(),
                      output_bytes=reader.total)


def kill_group(proc: subprocess.Popen) -> None:
    """Kill the child and anything it started (ninja, nvcc, a forked helper)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    CHILDREN.remove(proc)


def child_env(*, cuda: bool, gpu: str = "") -> dict:
    """Environment of every child the grader starts: the repository importable, no bytecode
    written into submission folders, and Triton's interpreter when there is no GPU. `gpu` (a
    UUID, 'GPU-…'): the one GPU its CUDA sees (a GPU worker's children); not a security boundary
    (the sandbox's device nodes are: grader/isolation/sandbox.py)."""
    env = dict(os.environ)
    env.setdefault("MAX_JOBS", "2")          # ninja inside one build: two sources
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    # Absolute entries only: an empty or relative one is the current folder to Python, and a
    # subject's current folder is the submission's (its json.py would shadow the standard one).
    inherited = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if os.path.isabs(p)]
    env["PYTHONPATH"] = os.pathsep.join([str(config.REPO_ROOT), *inherited])
    if CHILDREN.token:
        env[RUN_TOKEN_ENV] = CHILDREN.token
    if not cuda:
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif gpu:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env

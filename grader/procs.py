"""Run a child process with a wall-clock limit and capped output, killing its whole group.

A submission can hang, sleep, or print gigabytes; the grader must survive all three. Output is
read through a pipe as it comes: the first `head` and last `tail` bytes are kept, the rest is
counted and dropped, so nothing unbounded reaches memory or disk.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import re
import resource
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

from . import config
from .text import clean

# Every child of a grading run carries this variable (its value: the run's token), so the run's
# reaper (grader/reaper.py) can find a stray that left its process group, and tests can look
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
class CpuSplit:
    """The CPUs the GPU stages' processes run on (the harness and its subject, the checker, the
    health probe) and those the builds' run on (nvcc, ninja, an import check), each with
    everything it starts. Without a reservation both are every CPU the grader may use."""
    gpu: tuple[int, ...]
    build: tuple[int, ...]

    @property
    def reserved(self) -> bool:
        return self.gpu != self.build

    def describe(self) -> str:
        if self.reserved:
            return f"GPU stages on CPUs {_cpu_list(self.gpu)}, builds on {_cpu_list(self.build)}"
        return f"GPU stages share CPUs {_cpu_list(self.gpu)} with the builds (none reserved)"


def move_to_cpus(pids: Iterable[int], cpus: Iterable[int]) -> int:
    """Every thread of each process of `pids` allowed only `cpus` from now on (a run begun on the
    builds' CPUs moves to the GPU stages' at its turn: pipeline.Lookahead); threads they start
    later inherit it. Returns how many threads could not be moved (gone, or not this user's)."""
    pin, failed = frozenset(cpus), 0
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                os.sched_setaffinity(int(task), pin)
            except (OSError, ValueError):
                failed += 1
    return failed


class _GpuWorkers(threading.local):
    """How many GPU workers the run has (one per GPU: grader/pipeline.py), and which of them the
    calling thread is: the callers that ask split_cpus for `.gpu` or `.build` without saying
    (the checker, a build) get the calling worker's CPUs, or the builds' share."""
    slot = 0        # this thread's worker (gpu_worker)


_WORKERS = _GpuWorkers()
_WORKER_COUNT = [1]


def set_gpu_workers(count: int) -> None:
    """The number of GPU workers of the run from now on (1 when it ends)."""
    _WORKER_COUNT[0] = max(1, int(count))


@contextlib.contextmanager
def gpu_worker(slot: int):
    """The calling thread is GPU worker `slot` while inside: split_cpus gives its CPUs."""
    previous = getattr(_WORKERS, "slot", 0)
    _WORKERS.slot = slot
    try:
        yield
    finally:
        _WORKERS.slot = previous


def split_cpus(reserve: int, available: Iterable[int] | None = None, *,
               workers: int | None = None, slot: int | None = None) -> CpuSplit:
    """Which CPUs the GPU stages keep to themselves and which the builds get, from `available`
    (default: the CPUs this process may run on, os.sched_getaffinity, not os.cpu_count).

    With at least config.RESERVE_MIN_CPUS available, the `reserve` highest-numbered
    (Limits.gpu_stage_cpus: 3, GRADER_GPU_STAGE_CPUS overrides) go to the GPU stages and the
    builds get the rest, at least one; CPU 0, which takes most interrupts, stays with the builds.
    With fewer, or `reserve` 0, nothing is reserved: both get them all, and the timed calls share
    the machine with whatever compiles. Hyperthread siblings are not kept apart: a build may run
    on the other half of a reserved core.

    With several GPU workers (`workers`, default the run's: set_gpu_workers), each keeps
    `reserve` CPUs of its own (fewer, down to one, when the builds would be left none; none when
    even that leaves none), worker 0 the highest-numbered, worker 1 the next below, ...; `.gpu`
    is worker `slot`'s (default the calling thread's: gpu_worker) and `.build` what no worker
    keeps. One worker: exactly the split above."""
    cpus = tuple(sorted(set(os.sched_getaffinity(0) if available is None else available)))
    workers = max(1, _WORKER_COUNT[0] if workers is None else workers)
    slot = getattr(_WORKERS, "slot", 0) if slot is None else slot
    if reserve <= 0 or len(cpus) < config.RESERVE_MIN_CPUS:
        return CpuSplit(gpu=cpus, build=cpus)
    if workers == 1:
        reserve = min(reserve, len(cpus) - 1)
        return CpuSplit(gpu=cpus[-reserve:], build=cpus[:-reserve])
    reserve = min(reserve, (len(cpus) - 1) // workers)
    if reserve <= 0:
        return CpuSplit(gpu=cpus, build=cpus)
    slot = min(max(0, slot), workers - 1)
    end = len(cpus) - slot * reserve
    return CpuSplit(gpu=cpus[end - reserve:end], build=cpus[:len(cpus) - workers * reserve])


def default_build_jobs(split: CpuSplit, available_bytes: int | None = None) -> int:
    """How many builds run at once unless told (--jobs): one per CPU the builds run on, so that
    a course's builds, the longest stage, keep every core busy (a compile check is one nvcc
    process at a time; a GPU build's ninja runs two compiles, MAX_JOBS, then links), and no more
    than the machine's available memory holds at config.BUILD_PEAK_GB each."""
    if available_bytes is None:
        available_bytes = _available_memory()
    by_memory = int(available_bytes // int(config.BUILD_PEAK_GB * (1 << 30)))
    return max(1, min(len(split.build), by_memory))


def _available_memory() -> int:
    """MemAvailable (what can be used without swapping), else the physical memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _cpu_list(cpus: tuple[int, ...]) -> str:
    """'0-12' or '0,2,5-7', as taskset and /proc write CPU lists."""
    runs: list[list[int]] = []
    for cpu in cpus:
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)


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
                 cpus: Iterable[int] | None = None
                 ) -> tuple[subprocess.Popen, "_CappedReader"]:
    """Start `cmd` in a new session with stdout and stderr merged into a capped reader.
    `memory_bytes` caps the address space of it and its children (not for CUDA processes: the
    driver maps far more virtual memory than it uses); `file_bytes` caps any file they write;
    `pass_fds` stay open in the child; `cpus` (a CpuSplit's, among this process's own CPUs)
    are the only CPUs it and everything it starts may run on."""

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
                started: Callable[[int], None] | None = None,
                ended: Callable[[int], None] | None = None) -> ProcResult:
    """Run `cmd` in a new session with a wall-clock limit; output merged and capped, `cpus` the
    only CPUs it runs on (spawn_capped). `started(pid)` once it runs and `ended(pid)` once its
    group is killed (grader/quota.py: the folder it writes)."""
    start = time.monotonic()
    proc, reader = spawn_capped(cmd, env=env, cwd=cwd, head_bytes=head_bytes,
                                tail_bytes=tail_bytes, memory_bytes=memory_bytes,
                                file_bytes=file_bytes, cpus=cpus)
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
    to exit (grader/gate.py: none that ran submission code may hold a CUDA context once the next
    time stage can begin); those still running then are returned, for the caller to say."""
    kill_group(proc)
    for _ in range(3):
        kill_tree(tree)
        later = find() if find is not None else {}
        if later.keys() <= tree.keys():
            break
        tree.update(later)
    return wait_exited(set(tree), timeout_s=timeout_s)


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
    (the sandbox's device nodes are: grader/sandbox.py)."""
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

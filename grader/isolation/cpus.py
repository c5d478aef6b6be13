"""Which CPUs the GPU stages keep and which the builds get (CpuSplit, split_cpus), per GPU worker
of the run (set_gpu_workers, gpu_worker); moving a running process's threads onto them
(move_to_cpus); and how many builds run at once unless told (default_build_jobs)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from typing import Iterable

from grader.common import config


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


def build_priority(nice: int, *, gpu: bool, split: CpuSplit) -> int:
    """A build's CPU priority (Limits.build_nice; grader/isolation/priority.py): `nice` on a GPU
    machine whose GPU stages keep CPUs of their own (`split`.reserved, split_cpus's), where the
    builds' CPUs are shared with the runs begun early that a turn waits for; else 0. Without a GPU
    nothing is timed; on a machine too small to reserve CPUs the GPU stages' own work, and
    anything else it runs, would leave the builds only what they do not use (CI's 2-core machine
    under load: half as many runs begun early)."""
    return nice if gpu and nice > 0 and split.reserved else 0


def move_to_cpus(pids: Iterable[int], cpus: Iterable[int]) -> int:
    """Every thread of each process of `pids` allowed only `cpus` from now on (a run begun on the
    builds' CPUs moves to the GPU stages' at its turn: lookahead.Lookahead); threads they start
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
    """How many GPU workers the run has (one per GPU: grader/schedule/workers.py), and which of them the
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

"""Who used the GPU during the timed calls, read through NVML by this process: the processes
holding a CUDA context (gpu_context_pids, gpu_helpers), and NVML's utilization samples of the
whole GPU and of each process (read_gpu_samples), gathered between calls by BusyWatch."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import torch

from grader.common import config
from grader.common.text import clean
from grader.isolation.tree import process_tree
from grader.trusted.link import Link
from grader.trusted.timing import GpuBusy, GpuSamples, gpu_busy


def gpu_context_pids() -> set[int] | None:
    """Host pids of the processes holding a CUDA context on any GPU; None when NVML and
    nvidia-smi cannot say."""
    try:
        import pynvml
        pynvml.nvmlInit()
        pids = set()
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            pids |= {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
        return pids
    except Exception:
        pass
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "--query-compute-apps=pid", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
        return {int(x) for x in out.split() if x.strip().isdigit()}
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def read_gpu_samples(since_us: int) -> GpuSamples:
    """NVML's utilization samples of this process's GPU taken after `since_us` (µs on the host's
    wall clock): the whole GPU's (NVML_GPU_UTILIZATION_SAMPLES) and each process's
    (nvmlDeviceGetProcessUtilization, by host pid). The one place that reads them: BusyWatch
    calls it, and a test or another source replaces it. Never raises: what it cannot read, it
    says why."""
    try:
        import pynvml
    except ImportError:
        return GpuSamples(why="pynvml (the nvidia-ml-py package) is not installed")
    try:
        handle = _nvml_handle(pynvml)
    except Exception as e:   # pynvml.NVMLError and its kin, no GPU, no driver
        return GpuSamples(why=f"NVML cannot be read here ({clean(str(e), 200)})")
    device, device_why = _nvml_read(lambda: _nvml_device_samples(pynvml, handle, since_us), pynvml)
    processes, process_why = _nvml_read(
        lambda: tuple((int(p.timeStamp), int(p.pid), float(p.smUtil))
                      for p in pynvml.nvmlDeviceGetProcessUtilization(handle, since_us)), pynvml)
    return GpuSamples(device=device, processes=processes,
                      why="; ".join(w for w in (device_why, process_why) if w))


_NVML: dict = {}   # the handle of this process's GPU, found once


def _nvml_handle(pynvml):
    """NVML's handle of the GPU this process uses: NVML numbers GPUs its own way (it ignores
    CUDA_VISIBLE_DEVICES), so the GPU is found by its UUID."""
    if "handle" not in _NVML:
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device")
        pynvml.nvmlInit()
        uuid = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", None)
        if uuid is not None:
            _NVML["handle"] = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
        elif pynvml.nvmlDeviceGetCount() == 1:
            _NVML["handle"] = pynvml.nvmlDeviceGetHandleByIndex(0)
        else:
            raise RuntimeError("this torch does not say which of NVML's GPUs is this process's")
    return _NVML["handle"]


def _nvml_read(read, pynvml) -> tuple[tuple | None, str]:
    """(what `read` returned, '') or (None, why); NVML's "not found" (no sample since the time
    asked for) is no samples, not a failure."""
    try:
        return read(), ""
    except Exception as e:
        # pynvml raises NVMLError(NVML_SUCCESS) when a first call finds no sample to size for
        if getattr(e, "value", None) in (0, getattr(pynvml, "NVML_ERROR_NOT_FOUND", 6)):
            return (), ""
        return None, f"NVML: {clean(str(e), 200)}"


# pynvml's c_nvmlValue_t member for each nvmlValueType_t
_NVML_VALUE = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


def _nvml_device_samples(pynvml, handle, since_us: int) -> tuple[tuple[int, float], ...]:
    kind, samples = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, since_us)
    member = _NVML_VALUE[kind] if 0 <= kind < len(_NVML_VALUE) else "uiVal"
    return tuple((int(x.timeStamp), float(getattr(x.sampleValue, member))) for x in samples)


def _wall_us() -> int:
    """Now on the clock NVML stamps its samples with: the host's wall clock, in µs."""
    return int(time.time() * 1e6)


class BusyWatch:
    """How busy NVML saw the GPU during the timed loop, and for whom (timing.gpu_busy): its
    samples taken up between calls at least every config.TIMING_NVML_READ_S, and after the loop,
    with the subject's host pids as they were then. NVML keeps 14 s of whole-GPU samples (one
    per 200 ms on an H100) but only each process's newest: read every 0.5 s, 3 of 5 per-process
    samples were lost and the subject's busy share read 40% for 99%; read every 0.15 s, every
    one arrived and agreed with the whole GPU's within a point (notes/gpu_runs.md, session 19).

    Invariant: what tells host time from hidden GPU work is observed here, outside the subject.
    The subject can fake its own account of itself (a CUDA event synchronized with blocking=True
    sleeps while hidden GPU work runs); NVML's samples, read by this process, it cannot."""

    def __init__(self, link: Link):
        self.link = link
        self.start_us = self.end_us = 0
        self.device: dict[int, float] = {}
        self.processes: dict[tuple[int, int], float] = {}
        self.pids: set[int] = set()
        self.why: list[str] = []
        self.read_device = self.read_processes = False   # has any read of each kind worked

    def start(self) -> None:
        self.start_us = self.last_us = _wall_us()

    def due(self) -> bool:
        """Whether the next read is due (TIMING_NVML_READ_S since the last)."""
        return _wall_us() - self.last_us >= config.TIMING_NVML_READ_S * 1e6

    def read(self) -> None:
        """The samples since the last look (from the older of the two kinds' newest, so that
        neither misses one stamped before the other's newest), and the subject's processes now."""
        self.last_us = _wall_us()
        self.pids |= set(self.link.processes())
        got = read_gpu_samples(min(max([self.start_us, *self.device]),
                                   max([self.start_us, *(t for t, _ in self.processes)])))
        if got.why and got.why not in self.why:
            self.why.append(got.why)
        self.read_device |= got.device is not None
        self.read_processes |= got.processes is not None
        for t, percent in got.device or ():
            if 0 <= percent <= 100:
                self.device[t] = percent
        for t, pid, percent in got.processes or ():
            if 0 <= percent <= 100:
                self.processes[(t, pid)] = percent

    def stop(self, calls: int) -> GpuBusy:
        """The loop has ended: the last samples, and what they say about it."""
        self.end_us = _wall_us()
        self.read()
        return gpu_busy(self.device if self.read_device else None,
                        self.processes if self.read_processes else None,
                        start_us=self.start_us, end_us=self.end_us, calls=calls,
                        subject=self.pids, grader={os.getpid()}, why="; ".join(self.why))


def gpu_helpers(link: Link) -> dict | None:
    """{'pids': [...]} when more than one process of the submission's holds a CUDA context now;
    {} when only one does; None when that cannot be seen here."""
    pids = gpu_context_pids()
    if pids is None:
        return None
    mine = pids & process_tree(link.proc.pid)
    if not mine:
        return None    # the subject's context is not visible from here (another pid namespace)
    return dict(pids=sorted(mine)) if len(mine) > 1 else {}

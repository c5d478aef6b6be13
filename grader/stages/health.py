"""The GPU's health after a submission crashed or was killed: a probe in a process of its own,
and every run begun early beside the crash let go (ensure_gpu_healthy)."""

from __future__ import annotations

import sys
import time

from grader.isolation.procs import run_limited
from grader.stages.ahead import early
from grader.stages.context import GpuUnhealthy, GradeContext


def ensure_gpu_healthy(ctx: GradeContext, *, tries: int = 2) -> None:
    """After a crash or a kill, make sure the next submission gets a working GPU. A run begun
    early beside the crash or the hung kernel is let go, this worker's at once and, where lanes
    share the GPU, every other lane's on its turn (GpuGate.health_check): it runs afresh."""
    early().drop()
    if not ctx.device.cuda:
        return
    if ctx.gate is not None:
        ctx.gate.health_check()
    probe_gpu(ctx, tries)
    if ctx.gate is not None:
        ctx.gate.health_check()   # what began during the check too


def probe_gpu(ctx: GradeContext, tries: int) -> None:
    """A small computation on the GPU in a process of its own, up to `tries` times; GpuUnhealthy
    when none works."""
    probe = ("import torch; x = torch.ones(1 << 20, device='cuda'); "
             "assert float(x.sum()) == float(1 << 20); torch.cuda.synchronize()")
    for attempt in range(tries):
        proc = run_limited([sys.executable, "-c", probe], timeout_s=120, env=ctx.env,
                           cpus=ctx.cpus.gpu)
        if proc.ok:
            return
        time.sleep(5 * (attempt + 1))
    raise GpuUnhealthy(f"the GPU failed its health check after a submission:\n{proc.tail(15)}")

"""Time one call of a kernel: CUDA events, warm-up, L2 flushed before each call, fresh inputs.

Repeats until the relative standard error of the mean is under TIMING_TARGET_RSE or the time
budget is spent. The median is what ranks; n, mean, std, min and the RSE are reported with it.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from typing import Callable

import torch

from . import config
from .inputs import make_random_inputs

# Captured when this module is imported, which the worker does before it loads submission code:
# a submission that later replaces torch.cuda.Event or time.perf_counter does not reach these.
_Event = torch.cuda.Event
_synchronize = torch.cuda.synchronize
_perf_counter = time.perf_counter


@dataclasses.dataclass(frozen=True)
class TimingStats:
    n: int
    median_ms: float
    mean_ms: float
    min_ms: float
    std_ms: float
    rse: float                # std / sqrt(n) / mean
    tflops: float             # 4·B·H·S²·D / median
    warmup_calls: int
    budget_s: float
    stopped_by: str           # 'rse', 'budget' or 'max_reps'
    wall_s: float             # wall-clock time of the timed loop

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TimingStats":
        return cls(**d)


def summarize(times_ms: list[float], *, flops: int, **extra) -> TimingStats:
    n = len(times_ms)
    mean = statistics.fmean(times_ms)
    std = statistics.stdev(times_ms) if n > 1 else 0.0
    median = statistics.median(times_ms)
    return TimingStats(n=n, median_ms=median, mean_ms=mean, min_ms=min(times_ms), std_ms=std,
                       rse=(std / n ** 0.5 / mean) if mean > 0 and n > 1 else float("inf"),
                       tflops=flops / (median * 1e-3) / 1e12 if median > 0 else 0.0, **extra)


def time_kernel(fn: Callable, shape: tuple[int, int, int, int], *, flops: int, budget_s: float,
                l2_bytes: int, device: str = "cuda") -> TimingStats:
    """Median time of fn(Q, K, V) on fresh random inputs of `shape` (batch, heads, seq, head_dim)."""
    # A buffer larger than L2, rewritten before every call, so no call finds its inputs cached.
    flush = torch.empty(max(2 * l2_bytes, 64 << 20), dtype=torch.uint8, device=device)
    seed = int.from_bytes(os.urandom(8), "little")   # unpredictable: never the public seed
    q, k, v = make_random_inputs(shape, seed=seed, device=device)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed ^ 0x5EED)

    def refill() -> None:
        for t in (q, k, v):
            t.normal_(generator=gen)

    for _ in range(config.TIMING_WARMUP_CALLS):
        refill()
        fn(q, k, v)
    _synchronize()

    times: list[float] = []
    stopped_by = "max_reps"
    start_wall = _perf_counter()
    deadline = start_wall + budget_s
    while len(times) < config.TIMING_MAX_REPS:
        refill()
        flush.zero_()
        start, end = _Event(enable_timing=True), _Event(enable_timing=True)
        start.record()
        fn(q, k, v)
        end.record()
        _synchronize()
        times.append(start.elapsed_time(end))
        if len(times) >= config.TIMING_MIN_REPS and summarize(times, flops=flops, warmup_calls=0,
                budget_s=0, stopped_by="", wall_s=0).rse < config.TIMING_TARGET_RSE:
            stopped_by = "rse"
            break
        if _perf_counter() > deadline and len(times) >= 2:
            stopped_by = "budget"
            break
    return summarize(times, flops=flops, warmup_calls=config.TIMING_WARMUP_CALLS,
                     budget_s=budget_s, stopped_by=stopped_by, wall_s=_perf_counter() - start_wall)

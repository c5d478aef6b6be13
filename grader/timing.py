"""Time one call of a kernel: CUDA events, warm-up, L2 flushed before each call, fresh inputs.

Every call gets new random inputs from a seed drawn from os.urandom (never the public seed), and
the device is synchronized (all streams) before and after it. Each call is measured by two
clocks: CUDA events on the current stream, and the host's wall clock between the two device-wide
synchronizes; work that escapes the events shows up in the second (grader/integrity.py judges).
A random subset of the timed calls (reservoir sampling, decided after each call returns) keeps
its seed and a copy of its output, taken before the next call starts, for the checker process to
compare with the reference: cached, replayed or deferred outputs are caught there.

Repeats until the relative standard error of the mean is under TIMING_TARGET_RSE or the time
budget is spent. The median is what ranks; n, mean, std, min and the RSE are reported with it.
"""

from __future__ import annotations

import dataclasses
import os
import random
import statistics
import time
from typing import Callable

import torch

from . import config
from .inputs import make_random_inputs

# Captured when this module is imported, which the worker does before it loads submission code:
# a submission that later replaces torch.cuda.Event (or its methods), torch.cuda.synchronize or
# time.perf_counter does not reach these.
_Event = torch.cuda.Event
_record = torch.cuda.Event.record
_elapsed_time = torch.cuda.Event.elapsed_time
_synchronize = torch.cuda.synchronize
_perf_counter = time.perf_counter
_make_inputs = make_random_inputs
_urandom = os.urandom


@dataclasses.dataclass(frozen=True)
class SpotSample:
    """One timed call kept for the checker: its input seed and its output as returned."""
    call: int
    seed: int
    output: torch.Tensor


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
    wall_median_ms: float = 0.0   # the second clock: device-wide synchronize to synchronize, per call
    launched: tuple = ()          # [name, count] of what the warm-up and timed calls launched

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TimingStats":
        return cls(**{**d, "launched": tuple(tuple(x) for x in d.get("launched", ()))})


def relative_standard_error(times_ms: list[float]) -> float:
    """std / sqrt(n) / mean; inf with fewer than two times."""
    n, mean = len(times_ms), statistics.fmean(times_ms)
    return statistics.stdev(times_ms) / n ** 0.5 / mean if n > 1 and mean > 0 else float("inf")


def summarize(times_ms: list[float], *, flops: int, **extra) -> TimingStats:
    n = len(times_ms)
    mean = statistics.fmean(times_ms)
    std = statistics.stdev(times_ms) if n > 1 else 0.0
    median = statistics.median(times_ms)
    return TimingStats(n=n, median_ms=median, mean_ms=mean, min_ms=min(times_ms), std_ms=std,
                       rse=relative_standard_error(times_ms),
                       tflops=flops / (median * 1e-3) / 1e12 if median > 0 else 0.0, **extra)


def launched_names(prof, device: str) -> list[list]:
    """[name, count] of the GPU kernels (with a GPU) or aten operators (without one) that a
    torch.profiler session saw, most frequent first. The profiler sees every launch in the
    process, whatever library or stream it came from."""
    from collections import Counter
    names = Counter()
    for event in prof.events():
        on_gpu = getattr(event, "device_type", None) == torch.autograd.DeviceType.CUDA
        if (device == "cuda" and on_gpu) or (device != "cuda" and not on_gpu and event.name.startswith("aten::")):
            names[event.name] += 1
    return [[name[:300], count] for name, count in names.most_common(50)]


def time_kernel(fn: Callable, shape: tuple[int, int, int, int], *, flops: int, budget_s: float,
                l2_bytes: int, device: str = "cuda",
                spot_samples: int = config.TIMING_SPOT_SAMPLES,
                record_launches: bool = False) -> tuple[TimingStats, list[SpotSample]]:
    """Median time of fn(Q, K, V) on fresh random inputs of `shape` (batch, heads, seq, head_dim),
    and `spot_samples` timed calls chosen at random for the output check. `record_launches`:
    the whole loop runs under torch.profiler (GPU activity), so a submission that behaves only
    when profiled behaves in every timed call; what ran is in `.launched` of the stats."""
    loop = dict(flops=flops, budget_s=budget_s, l2_bytes=l2_bytes, device=device,
                spot_samples=spot_samples)
    if not record_launches:
        return _time_loop(fn, shape, **loop)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:   # the loop's own kernels
        _make_inputs(shape, seed=1, device=device)
        torch.empty(1 << 20, dtype=torch.uint8, device=device).zero_()
        _synchronize()
    grader_kernels = {name for name, _ in launched_names(prof, device)}
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        stats, samples = _time_loop(fn, shape, **loop)
    launched = tuple((n, c) for n, c in launched_names(prof, device) if n not in grader_kernels)
    return dataclasses.replace(stats, launched=launched), samples


def _time_loop(fn: Callable, shape, *, flops: int, budget_s: float, l2_bytes: int, device: str,
               spot_samples: int) -> tuple[TimingStats, list[SpotSample]]:
    # A buffer larger than L2, rewritten before every call, so no call finds its inputs cached.
    flush = torch.empty(max(2 * l2_bytes, 64 << 20), dtype=torch.uint8, device=device)
    pick = random.Random(_urandom(16))   # which calls are checked: unknown to the submission

    def fresh_inputs() -> tuple[int, tuple[torch.Tensor, ...]]:
        seed = int.from_bytes(_urandom(8), "little") >> 1   # unpredictable: never the public seed
        return seed, _make_inputs(shape, seed=seed, device=device)

    for _ in range(config.TIMING_WARMUP_CALLS):
        fn(*fresh_inputs()[1])
    _synchronize()

    times: list[float] = []
    walls: list[float] = []
    samples: list[SpotSample] = []
    stopped_by = "max_reps"
    start_wall = _perf_counter()
    deadline = start_wall + budget_s
    while len(times) < config.TIMING_MAX_REPS:
        seed, (q, k, v) = fresh_inputs()
        flush.zero_()
        start, end = _Event(enable_timing=True), _Event(enable_timing=True)
        _synchronize()                     # the whole device idle: inputs and flush are done
        wall0 = _perf_counter()
        _record(start)
        out = fn(q, k, v)
        _record(end)
        _synchronize()                     # the whole device: every stream the call used
        walls.append((_perf_counter() - wall0) * 1e3)
        times.append(_elapsed_time(start, end))
        _keep_sample(samples, pick, len(times) - 1, seed, out, spot_samples)
        del q, k, v, out
        if len(times) >= config.TIMING_MIN_REPS and relative_standard_error(times) < config.TIMING_TARGET_RSE:
            stopped_by = "rse"
            break
        if _perf_counter() > deadline and len(times) >= 2:
            stopped_by = "budget"
            break
    stats = summarize(times, flops=flops, warmup_calls=config.TIMING_WARMUP_CALLS,
                      budget_s=budget_s, stopped_by=stopped_by, wall_s=_perf_counter() - start_wall,
                      wall_median_ms=statistics.median(walls))
    return stats, samples


def _keep_sample(samples: list[SpotSample], pick: random.Random, call: int, seed: int, out,
                 size: int) -> None:
    """Reservoir sampling: after call i, each of the calls so far is kept with equal chance."""
    if size <= 0:
        return
    slot = call if call < size else pick.randrange(call + 1)
    if slot >= size:
        return
    copy = out.detach().clone() if isinstance(out, torch.Tensor) else out
    sample = SpotSample(call, seed, copy)
    if slot < len(samples):
        samples[slot] = sample
    else:
        samples.append(sample)

"""Timing statistics: what the harness's per-call times are summarized into.

The times themselves are measured by grader/harness.py, the trusted process that drives each call:
its host clock from "go" to the reply and its GPU events up to its first GPU work after the reply,
the later of the two, less the protocol's own cost (a round trip, two GPU context switches and
the output's copy into the shared buffer), measured on a subject that runs no submission. Every call
gets fresh inputs (os.urandom seeds) and a flushed L2. The loop runs at least TIMING_MIN_REPS
calls, then until the relative standard error of the mean is under TIMING_TARGET_RSE or the
budget is spent; the median ranks.
"""

from __future__ import annotations

import dataclasses
import statistics


@dataclasses.dataclass(frozen=True)
class TimingStats:
    n: int
    median_ms: float          # what ranks: measured by the harness, never by the subject
    mean_ms: float
    min_ms: float
    std_ms: float
    rse: float                # std / sqrt(n) / mean
    tflops: float             # 4·B·H·S²·D / median
    warmup_calls: int
    budget_s: float
    stopped_by: str           # 'rse', 'coarse' (config.TIMING_COARSE_*), 'budget' or 'max_reps'
    wall_s: float             # wall-clock time of the timed loop
    wall_median_ms: float = 0.0    # the harness's host clock alone: "go" to the reply
    fence_median_ms: float = 0.0   # the harness's GPU clock alone: to its first GPU work after the reply
    raw_mean_ms: float = 0.0       # mean of the later clock, before the copy is subtracted
    protocol_ms: float = 0.0       # mean subtracted per call: the protocol's own cost (ProtocolCost), measured on null subjects
    rtt_ms: float = 0.0            # one request/reply round trip with the subject (not subtracted)
    launched: tuple = ()           # [name, count, GPU µs] over the profiled calls, as the subject reported them
    profiled_calls: int = 0        # calls the profiler saw: the timed ones and the last warm-up call
    subject_events_ms: float = 0.0 # diagnostic only, never ranked: the median of the subject's own CUDA
                                   # events around its calls, as it reported them (the protocol's overhead
                                   # is median_ms against this, on the same calls: bench/timing_trust.py)
    subject_host_ms: float = 0.0   # diagnostic only: the subject's host clock from request to reply
    subject_copy_ms: float = 0.0   # diagnostic only: the subject's events around its copy into O
    pipe_ms: float = 0.0           # diagnostic only: "go" and the reply through the pipes (both
                                   # processes' host clocks); with the copy, fence - wall (the GPU
                                   # switching back to the harness) and the rest, the protocol's cost
    median_low_ms: float = 0.0     # a distribution-free 95% confidence interval of the median
    median_high_ms: float = 0.0    # (order statistics): how far two rows' medians may differ by chance

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TimingStats":
        known = {f.name for f in dataclasses.fields(cls)}
        d = {k: v for k, v in d.items() if k in known}
        return cls(**{**d, "launched": tuple(tuple(x) for x in d.get("launched", ()))})


@dataclasses.dataclass(frozen=True)
class ProtocolCost:
    """What the protocol itself adds to a timed call, measured once per run by the harness on
    trusted subjects that load no submission (grader/harness.py calibrate):

    - idle_ms: a call that does no GPU work (the round trip, the output's copy, the GPU context
      switches);
    - busy_ms: a call that runs an attention kernel on the timed case (harness.CALIBRATION_KERNELS:
      SDPA's cuDNN and FLASH kernels), less that work as the kernel's own CUDA events measured it,
      averaged over the kernels. On an H100 this is 0.2-0.4 ms more than idle_ms, about the same
      for a 13 ms and a 25 ms kernel (notes/gpu_runs.md, bench/protocol_probe.json);
    - busy_work_ms: the shortest of those kernels' work.

    A call of w ms of work beyond the idle cost pays idle_ms plus the difference, scaled by
    min(w / busy_work_ms, 1): between the two measured costs, never beyond them. The subtracted
    cost grows with the raw time at a slope below 1, so a slower call is never ranked faster."""
    idle_ms: float = 0.0
    busy_ms: float = 0.0
    busy_work_ms: float = 0.0

    def for_call(self, raw_ms: float) -> float:
        extra = self.busy_ms - self.idle_ms
        if extra <= 0 or self.busy_work_ms <= 0:
            return self.idle_ms
        share = min(max(raw_ms - self.idle_ms, 0.0) / self.busy_work_ms, 1.0)
        return self.idle_ms + min(extra, 0.5 * self.busy_work_ms) * share

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> "ProtocolCost":
        d = d or {}
        return cls(**{f.name: float(d.get(f.name, 0.0)) for f in dataclasses.fields(cls)})


def relative_standard_error(times_ms: list[float]) -> float:
    """std / sqrt(n) / mean; inf with fewer than two times."""
    n, mean = len(times_ms), statistics.fmean(times_ms)
    return statistics.stdev(times_ms) / n ** 0.5 / mean if n > 1 and mean > 0 else float("inf")


def median_interval(times_ms: list[float]) -> tuple[float, float]:
    """95% confidence interval of the median from the sorted times (the normal approximation to
    the binomial: ranks n/2 -+ 0.98 sqrt(n)); the whole range for fewer than 6 times."""
    ordered, n = sorted(times_ms), len(times_ms)
    half = 0.98 * n ** 0.5
    low, high = int(n / 2 - half), int(n / 2 + half + 0.999)
    if n < 6 or low < 0 or high >= n:
        return ordered[0], ordered[-1]
    return ordered[low], ordered[high]


def summarize(times_ms: list[float], *, flops: int, **extra) -> TimingStats:
    n = len(times_ms)
    mean = statistics.fmean(times_ms)
    std = statistics.stdev(times_ms) if n > 1 else 0.0
    median = statistics.median(times_ms)
    low, high = median_interval(times_ms)
    return TimingStats(n=n, median_ms=median, mean_ms=mean, min_ms=min(times_ms), std_ms=std,
                       rse=relative_standard_error(times_ms), median_low_ms=low, median_high_ms=high,
                       tflops=flops / (median * 1e-3) / 1e12 if median > 0 else 0.0, **extra)

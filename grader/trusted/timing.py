"""Timing statistics: what the harness's per-call times are summarized into.

The times themselves are measured by grader/trusted/harness.py, the trusted process that drives each call:
its host clock from "go" to the reply and its GPU events up to its first GPU work after the reply,
the later of the two, less the protocol's own cost (a round trip, two GPU context switches and
the output's copy into the shared buffer), measured on a subject that runs no submission. Every call
gets fresh inputs (os.urandom seeds) and a flushed L2. The loop runs at least TIMING_MIN_REPS
calls, then until the relative standard error of the mean is under TIMING_TARGET_RSE or the
budget is spent; the median ranks.

How busy the GPU was meanwhile, and for whom (gpu_busy), is summed here from NVML's samples,
which the harness reads: grader/trusted/integrity.py tells host time from hidden GPU work with it.
"""

from __future__ import annotations

import bisect
import dataclasses
import statistics
from grader.course.verdicts import TimingStats


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


# ---------------------------------------------------------------- how busy the GPU was (NVML)

# NVML's samples are summed over whole sampling periods inside the timed loop; with fewer than
# this many the loop is too short for them to say anything.
BUSY_MIN_PERIODS = 4
# A period longer than this many times the usual one lost samples (a read of NVML failed, or came
# after its buffer wrapped): it is left out, with what fell in it.
BUSY_GAP = 2.5
# Per-process samples are used only when they add up to the whole GPU's samples within this share
# of the sampled time: on one GPU the processes' kernels take turns (no MPS), so the two agree
# when per-process samples are what they claim to be; when they do not (sparse samples, another
# meaning of smUtil on this driver), the whole GPU's are used instead.
BUSY_AGREEMENT = 0.05


@dataclasses.dataclass(frozen=True)
class GpuSamples:
    """What the sampling source said about the GPU after a moment (gpu_watch.read_gpu_samples:
    NVML): the whole GPU's samples, (t_us, percent of the period ending at t_us during which a
    kernel ran), and each process's, (t_us, host pid, the same percent for its kernels); t_us on
    the host's wall clock in µs. None where the source could not say, with why."""
    device: tuple[tuple[int, float], ...] | None = None
    processes: tuple[tuple[int, int, float], ...] | None = None
    why: str = ""


@dataclasses.dataclass(frozen=True)
class GpuBusy:
    """How busy the GPU was over the timed loop (window_ms of wall time, `calls` calls), as
    shares of the part NVML's samples cover (sampled_ms, in `periods` periods of period_ms):
    any kernel at all (device_share), the submission's processes' kernels (subject_share), and
    those of processes neither the submission's nor the grader's (others_share, others_pids).
    source: 'process' (per-process samples, checked against the whole GPU's), 'device' (the
    whole GPU's only: the grader's own work between calls is in it) or '' (NVML cannot tell: why)."""
    source: str = ""
    why: str = ""
    window_ms: float = 0.0
    calls: int = 0
    sampled_ms: float = 0.0
    periods: int = 0
    period_ms: float = 0.0
    device_share: float = 0.0
    subject_share: float = 0.0
    others_share: float = 0.0
    others_pids: tuple[int, ...] = ()

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> "GpuBusy":
        if not d:
            return cls(why="nothing was recorded about the GPU's activity")
        known = {f.name for f in dataclasses.fields(cls)}
        d = {k: v for k, v in d.items() if k in known}
        return cls(**{**d, "others_pids": tuple(d.get("others_pids", ()))})


def gpu_busy(device: dict[int, float] | None, processes: dict[tuple[int, int], float] | None, *,
             start_us: int, end_us: int, calls: int, subject: set[int], grader: set[int],
             why: str = "") -> GpuBusy:
    """The GPU's activity over [start_us, end_us] from NVML's samples: whole-GPU ones
    {t_us: percent} and per-process ones {(t_us, host pid): percent}, and who the submission's
    (`subject`) and the grader's (`grader`) host pids are.

    The whole GPU's samples set the periods: a period ends at each sample, and only periods
    wholly inside the window count, none that lost samples (BUSY_GAP). A process's sample counts
    in the period it falls in, and a process absent from a period was idle in it (NVML lists only
    processes that used the GPU). Per-process samples are used only when some name the grader's
    own process (it works on the GPU between every two calls: samples that name none of its pids
    come from another pid namespace) and they add up to the whole GPU's within BUSY_AGREEMENT."""
    base = dict(window_ms=(end_us - start_us) / 1e3, calls=calls)
    grid = sorted(t for t in (device or {}) if start_us <= t <= end_us)
    if len(grid) <= BUSY_MIN_PERIODS:
        said = (f"only {max(len(grid) - 1, 0)} of NVML's whole-GPU sampling periods lay within "
                f"the timed loop's {base['window_ms']:.0f} ms")
        return GpuBusy(why=f"{why}; {said}" if why else said, **base)
    spans = [(b - a) / 1e3 for a, b in zip(grid, grid[1:])]
    usual = statistics.median(spans)
    spans = [span if span <= BUSY_GAP * usual else 0.0 for span in spans]   # gaps left out
    sampled = sum(spans)
    busy_device = sum(device[t] / 100 * span for t, span in zip(grid[1:], spans))
    base.update(sampled_ms=sampled, periods=sum(1 for span in spans if span), period_ms=usual,
                device_share=busy_device / sampled)
    if processes is None:
        return GpuBusy("device", why or "NVML gave no per-process samples", **base)
    per_pid = _busy_per_pid(processes, grid, spans)
    if not grader & set(per_pid) and busy_device > 0:
        return GpuBusy("device", "NVML gave no per-process sample while the GPU was busy" if not
                       per_pid else "NVML's per-process samples name no process of the grader's "
                       "(its host pids are not this process's: another pid namespace)", **base)
    total = sum(per_pid.values())
    if abs(total - busy_device) > BUSY_AGREEMENT * sampled:
        return GpuBusy("device", f"NVML's per-process samples add up to {total / sampled:.0%} of "
                       f"the sampled time and its whole-GPU samples to {busy_device / sampled:.0%}: "
                       f"they disagree, so the per-process ones are not used", **base)
    others = {pid: ms for pid, ms in per_pid.items() if pid not in subject | grader and ms > 0}
    return GpuBusy("process", **base,
                   subject_share=sum(per_pid.get(pid, 0.0) for pid in subject) / sampled,
                   others_share=sum(others.values()) / sampled, others_pids=tuple(sorted(others)))


def _busy_per_pid(processes: dict[tuple[int, int], float], grid: list[int],
                  spans: list[float]) -> dict[int, float]:
    """Busy ms of each pid over the periods (grid[j], grid[j+1]] (span ms each): a pid's samples
    within one period are averaged."""
    seen: dict[tuple[int, int], list[float]] = {}
    for (t, pid), percent in processes.items():
        j = bisect.bisect_left(grid, t) - 1   # t in (grid[j], grid[j + 1]]
        if 0 <= j < len(spans):
            seen.setdefault((pid, j), []).append(percent)
    busy: dict[int, float] = {}
    for (pid, j), percents in seen.items():
        busy[pid] = busy.get(pid, 0.0) + statistics.fmean(percents) / 100 * spans[j]
    return busy

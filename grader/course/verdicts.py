"""The typed result of each stage, as a result file stores it: BuildResult (build), CaseResult and
Finding (check: one case against the reference), TimingStats and ProtocolCost (time).

Plain data with to_dict/from_dict and nothing else, so that everything that reads results (the
pages, exports, review) can import them without the code that produced them.
"""

from __future__ import annotations

import dataclasses
from grader.common.status import Status


@dataclasses.dataclass(frozen=True)
class Finding:
    ok: bool
    numel: int
    mismatches: int          # elements outside the tolerance, NaN and inf included
    nan_count: int
    inf_count: int
    max_abs_error: float     # over finite elements
    max_rel_error: float
    rtol: float
    atol: float
    first_bad: tuple[BadElement, ...] = ()
    all_zero: bool = False   # the output is exactly zero everywhere: nothing was written
    problem: str = ""        # shape or dtype problems that make a comparison meaningless
    # The precision budget (flash-attention's rule): max abs error against the fp32 reference at
    # most `precision_factor` x the plain fp16 implementation's + `precision_floor`.
    plain_error: float | None = None       # the plain fp16 implementation's max abs error
    precision_factor: float | None = None
    precision_floor: float | None = None

    @property
    def precision_ratio(self) -> float | None:
        """The kernel's max abs error over the plain fp16 implementation's (None: not measured)."""
        if self.plain_error is None:
            return None
        return self.max_abs_error / self.plain_error if self.plain_error > 0 else float("inf")

    @property
    def over_budget(self) -> bool:
        if self.plain_error is None or self.precision_factor is None:
            return False
        return self.max_abs_error > self.precision_factor * self.plain_error + (self.precision_floor or 0.0)

    def budget_text(self) -> str:
        if self.plain_error is None:
            return ""
        return (f"precision budget: max abs error {self.max_abs_error:.3g} against the fp32 "
                f"reference; a plain fp16 implementation's is {self.plain_error:.3g} on the same "
                f"inputs (ratio {self.precision_ratio:.2f}); allowed: {self.precision_factor:g} x "
                f"that + {self.precision_floor:g}")

    def summary(self) -> str:
        if self.problem:
            return self.problem
        if self.ok:
            text = (f"ok: max abs error {self.max_abs_error:.3g}, max rel error "
                    f"{self.max_rel_error:.3g} (tolerance atol={self.atol:g}, rtol={self.rtol:g})")
            return text + (f"; error {self.precision_ratio:.2f} x a plain fp16 implementation's"
                           if self.plain_error is not None else "")
        if self.mismatches == 0 and self.over_budget:
            return ("outside the precision budget (every element is within the tolerance, but the "
                    "error is far above what fp16 inputs with fp32 accumulation give: low-precision "
                    "arithmetic, e.g. fp8, is not allowed)\n" + self.budget_text())
        lines = [f"{self.mismatches} of {self.numel} elements outside atol={self.atol:g} + "
                 f"rtol={self.rtol:g}·|expected|; max abs error {self.max_abs_error:.3g}, "
                 f"max rel error {self.max_rel_error:.3g}"]
        if self.nan_count or self.inf_count:
            lines.append(f"NaN: {self.nan_count}, inf: {self.inf_count}")
        if self.all_zero:
            lines.append("the output is all zeros: nothing was written to O")
        if self.over_budget:
            lines.append(self.budget_text())
        lines += [f"  {bad}" for bad in self.first_bad]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["first_bad"] = [dict(index=list(b.index), got=b.got, expected=b.expected)
                          for b in self.first_bad]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Finding":
        known = {f.name for f in dataclasses.fields(cls)}
        d = {k: v for k, v in d.items() if k in known}
        d["first_bad"] = tuple(BadElement(tuple(b["index"]), b["got"], b["expected"])
                               for b in d.get("first_bad", ()))
        return cls(**d)


@dataclasses.dataclass(frozen=True)
class CaseResult:
    case: str
    status: Status
    message: str = ""
    hidden: bool = False
    finding: Finding | None = None
    run_s: float | None = None              # the submission's first call on this case
    peak_memory_bytes: int | None = None    # of the check (reference + comparison)
    launched: tuple[tuple[str, int], ...] = ()   # GPU kernels (or CPU operators) of one call: name, count
    # Ended by the run stage's load rule (stages/run.py run_cases_under_load): an environment_error
    # of the overloaded machine's, which the run grades once more when the load has fallen.
    overloaded: bool = False

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["status"] = self.status.value
        d["finding"] = self.finding.to_dict() if self.finding else None
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "CaseResult":
        known = {f.name for f in dataclasses.fields(cls)}
        d = {k: v for k, v in d.items() if k in known}
        return cls(**{**d, "status": Status(d["status"]),
                      "finding": Finding.from_dict(d["finding"]) if d.get("finding") else None,
                      "launched": tuple(tuple(x) for x in d.get("launched", ()))})


@dataclasses.dataclass(frozen=True)
class BuildResult:
    status: Status            # PASS, BUILD_ERROR, TIMEOUT or ENVIRONMENT_ERROR
    mode: str                 # 'extension', 'compile_only' or 'import'
    elapsed_s: float
    artifact: str | None = None   # the built extension module (.so)
    message: str = ""             # one line for the student
    log_tail: str = ""            # the relevant part of the compiler's output
    reused: bool = False          # its files came from the build cache: nothing was compiled
    # The __global__ functions the object compiled from the submission's translation unit defines
    # (object_file.defined_kernels, demangled), filled when a CUDA build passes, a restored one too: the
    # kernels it may call its own (integrity.cpp_kernel_names). Empty for Python and failures.
    kernels: tuple[str, ...] = ()
    # What the audit of a passing CUDA build found for an instructor (reach.native_review, filled
    # by the pipeline's audit of the build): why it goes to review, and notes 'where: what' on
    # unusual but allowed constructs (those reasons among them).
    review: tuple[str, ...] = ()
    audit_notes: tuple[str, ...] = ()
    # Built for a student's `check` on their own machine (build/messages.StudentCheck): its
    # messages speak of that machine and name the limit to raise, and so do the hints.
    students_machine: bool = False
    # It timed out twice on an overloaded machine (ENVIRONMENT_ERROR): the run builds it once more
    # when the load has fallen (schedule/workers.py CourseRun.retry_round).
    under_load: bool = False
    # The folder of the Triton cache its kernels were compiled into during the build, with no GPU
    # (grader/build/ahead.py): its GPU stages' JIT folder starts from a copy. "" when none.
    compiled_ahead: str = ""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "BuildResult":
        """From to_dict's output, or an older result file's (no kernels, review or notes: none
        known)."""
        return cls(**{**d, "status": Status(d["status"]),
                      **{k: tuple(d.get(k) or ()) for k in ("kernels", "review", "audit_notes")}})


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
    # 'rse', 'coarse' (config.TIMING_COARSE_* or TIMING_SLOW_*), 'budget', 'bound' (the stage's
    # limit near: Limits.time_s) or 'max_reps'
    stopped_by: str
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
    trusted subjects that load no submission (grader/trusted/harness.py calibrate):

    - idle_ms: a call that does no GPU work (the round trip, the output's copy, the GPU context
      switches);
    - busy_ms: a call that runs an attention kernel on the timed case (calibration.CALIBRATION_KERNELS:
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


@dataclasses.dataclass(frozen=True)
class BadElement:
    index: tuple[int, ...]   # (b, h, s, d)
    got: float
    expected: float

    def __str__(self) -> str:
        return f"{self.index}: got {self.got:.6g}, expected {self.expected:.6g}"

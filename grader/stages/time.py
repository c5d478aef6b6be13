"""Time stage: the largest case timed by the harness (time_target: TimedRun, or the failure's
status and message), and the protocol's own cost, calibrated once per run on subjects that run
no submission (calibrate_protocol)."""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

from grader.common import config
from grader.common.status import Status
from grader.course.results import write_json_atomic
from grader.course.submission import Submission
from grader.course.verdicts import BuildResult, ProtocolCost, TimingStats
from grader.isolation.device import DeviceInfo
from grader.isolation.procs import Cancelled, stopping
from grader.problem import Case, largest
from grader.stages.context import GradeContext, health_checks_of
from grader.stages.folders import save_calls, save_log, scratch, subject_folders, target_of
from grader.stages.harnesses import Stages, TimeSubject, harness_said, harness_spec, run_harness
from grader.stages.health import ensure_gpu_healthy


def time_subject(sub: Submission, build: BuildResult, ctx: GradeContext, timed: Case, work: Path,
                 jit: Path | None) -> TimeSubject:
    """`sub`'s TimeSubject, begun now: its record goes to work/time.json."""
    fields = time_fields(timed, ctx, work)
    del fields["result"]   # harness_spec's: work/time.json
    spec, spec_path = harness_spec("time", target_of(sub, build), ctx, work, folder=subject_folders(sub, build),
                                   jit=jit, prepare=True, **fields)
    return TimeSubject(spec, spec_path, env=ctx.env, cpus=ctx.cpus, health_checks=health_checks_of(ctx))


@dataclasses.dataclass(frozen=True)
class TimedRun:
    stats: TimingStats
    record: dict      # what the harness saw: verification, spot checks, GPU processes


def time_fields(case: Case, ctx: GradeContext, work: Path) -> dict:
    """What the harness's time stage needs beyond the spec's common fields: the timed case, and
    the calls a run stage makes, with its limits, which a subject not timed on its run stage's
    makes first (run_stage.run_stage_calls)."""
    return dict(case=case.to_dict(), **run_stage_again(ctx),
                budget_s=ctx.limits.time_budget_s, **call_fields(ctx),
                coarse_ms=coarse_ms(case, ctx.device), slow_ms=slow_ms(case, ctx.device),
                protocol=ctx.protocol.to_dict(),
                precision=dict(precision_factor=ctx.precision[0], precision_floor=ctx.precision[1]),
                deadline_s=ctx.limits.time_s, result=str(work / "time.json"))


class TimedLater:
    """A time stage whose timed calls are over, on the run stage's subject, now gone: its harness
    finishes its trusted work (the statistics, the spot checks) while the pipeline goes on, and
    its record is read when it is wanted (result), beside the next submission's run stage when
    the rest is left behind the turn (stages/behind.py)."""

    def __init__(self, stages: Stages, finish):
        self._stages, self._finish = stages, finish

    def result(self) -> TimedRun | tuple[Status, str]:
        return self._finish(*self._stages.time_record(), in_turn=False)


def time_target(target: dict, case: Case, ctx: GradeContext, *, folder: list[Path],
                log_name: str | None = None, jit: Path | None = None,
                stages: Stages | None = None, timer: "TimeSubject | None" = None,
                later: bool = False) -> TimedRun | tuple[Status, str] | TimedLater:
    """Timing statistics of one case, measured by the harness (on the run stage's subject when
    `stages` are given, on `timer`'s prepared one, else on a new one); or (status, message) if
    the subject failed while being timed. `later`, with `stages`: once the timed calls are over,
    a TimedLater (the harness's trusted work goes on meanwhile)."""
    record = output = None
    if stages is not None:
        if stages.time_calls() and later:
            return TimedLater(stages, lambda record, output, in_turn: _timed(
                record, output, case, ctx, log_name, in_turn=in_turn))
        record, output = stages.time_record()
    elif timer is not None:
        record, output = timer.time(ctx.protocol)
        if record is None:   # it gave up before loading anything (time_stage.time_prepared)
            if stopping():
                raise Cancelled("the run is stopping: a prepared time stage was stopped")
            ctx.progress.note(f"{log_name or target}: its time stage's prepared subject did not "
                              f"start; timing on a new one" + harness_said(output))
    if record is None and stages is None:
        with tempfile.TemporaryDirectory(prefix="time-", dir=scratch()) as tmp:
            fields = time_fields(case, ctx, Path(tmp))
            del fields["result"]
            record, output = run_harness("time", target, ctx, Path(tmp), folder=folder, jit=jit,
                                         **fields)
    return _timed(record, output, case, ctx, log_name)


def _timed(record: dict | None, output: str, case: Case, ctx: GradeContext,
           log_name: str | None, *, in_turn: bool = True) -> TimedRun | tuple[Status, str]:
    """A time stage's record as a TimedRun, or the failure's (status, message); its logs saved.
    The GPU's health is checked after a failure in the turn; behind it (TimedLater: the timed
    calls had ended and the subject was gone when its trusted work failed) it is not, as the
    next submission's run stage may be on the GPU: a GPU left broken fails that run stage,
    whose health check then stops the run."""
    if log_name:
        save_log(ctx, log_name, "time", output)
        if record is not None and isinstance(record.get("times_ms"), list):
            save_calls(ctx, log_name, record)
    if record is None:
        if in_turn:
            ensure_gpu_healthy(ctx)
        return Status.RUNTIME_ERROR, f"grader error: the timing harness failed; tell the instructor\n{output[-2000:]}"
    if "failed" in record:
        if in_turn:
            ensure_gpu_healthy(ctx)
        failed = record["failed"]
        return Status(failed["status"]), failed["message"]
    return TimedRun(TimingStats.from_dict(record["stats"]), record)


def run_stage_fields(cases: list[Case], ctx: GradeContext) -> dict:
    """A run stage's calls, for its harness and for a subject timed without its run stage's
    (run_stage.run_stage_calls: on a GPU every case, run.select_cases): the cases in order, and
    each one's limit on a GPU (Limits.case_s)."""
    return dict(cases=[c.to_dict() for c in cases],
                case_limits={c.id: ctx.limits.case_s(c.flops) for c in cases} if ctx.device.cuda else {})


def call_fields(ctx: GradeContext) -> dict:
    """What every timed or calibrated call is made with (timed_calls.open_call): the L2 to flush
    and the GPU's idle before it, the same for every row and for the calibration that costs them."""
    return dict(l2_bytes=ctx.device.l2_bytes, idle_ms=ctx.limits.timing_idle_ms)


def run_stage_again(ctx: GradeContext) -> dict:
    """What a subject timed without its run stage's (a baseline's, the calibration's, a lane's
    own) is told to call first, and its limits: a run stage's calls on a GPU, every case
    (run.select_cases), with the run stage's limit (run_stage.run_stage_calls)."""
    return dict(**run_stage_fields(list(ctx.cases), ctx), run_deadline_s=ctx.limits.run_s)


def coarse_ms(case: Case, device: DeviceInfo) -> float | None:
    """The median above which a call is timed coarsely (config.TIMING_COARSE_FRACTION of the
    GPU's measured matmul peak); None where the peak is unknown."""
    if not device.matmul_tflops:
        return None
    return case.flops / (device.matmul_tflops * 1e12 * config.TIMING_COARSE_FRACTION) * 1e3


def slow_ms(case: Case, device: DeviceInfo) -> float | None:
    """The median above which a call is placed on config.TIMING_SLOW_CALLS calls, after one
    warm-up (config.TIMING_SLOW_FACTOR times coarse_ms); None where the peak is unknown."""
    coarse = coarse_ms(case, device)
    return None if coarse is None else coarse * config.TIMING_SLOW_FACTOR


PROTOCOL_FILE = "_protocol.json"   # the run's ProtocolCost, for the rows a resumed run keeps


def calibrate_protocol(ctx: GradeContext, *, reuse: bool = False) -> ProtocolCost:
    """The protocol's own cost per timed call on the largest case, measured once per run by the
    harness on subjects that run no submission (grader/trusted/harness.py calibrate); zero without a GPU
    or if it failed (then times include it, for every row alike). With `reuse` (a resumed run
    that keeps results timed earlier), the cost those were corrected with is used again if it was
    measured on this GPU for this case: every row of one run has the same cost subtracted. In a
    course it runs while the worker's first runs are begun (lookahead.first_turn): their harnesses
    and subjects start CUDA beside its calls, as the next runs' do beside every timed call."""
    if not ctx.device.cuda:
        return ProtocolCost()
    # One file per GPU: the first GPU's where it always was, another's beside it.
    saved = ctx.out_dir / (f"_protocol.{ctx.gpu_tag}.json" if ctx.gpu_tag else PROTOCOL_FILE)
    where = dict(device=ctx.device.name, uuid=ctx.device.uuid or None,
                 case=largest(list(ctx.cases)).id)
    if reuse:
        try:
            earlier = json.loads(saved.read_text())
            was, now = dict(earlier.get("where") or {}), dict(where)
            if None in (was.get("uuid"), now["uuid"]):   # written before GPUs had UUIDs here
                was["uuid"] = now["uuid"] = None
            if was == now:
                cost = ProtocolCost.from_dict(earlier.get("cost"))
                ctx.progress.note(f"protocol cost of the results kept from the earlier run "
                                  f"reused: {cost.idle_ms:.3f} / {cost.busy_ms:.3f} ms")
                return cost
        except (OSError, ValueError, TypeError, AttributeError):
            pass
    cost, breakdown = _measure_protocol(ctx)
    # breakdown: each calibration subject's medians (wall, fence, its own events), for the figures
    # of bench/timing_trust.py (each trusted kernel's cost beside the one subtracted)
    write_json_atomic(saved, dict(where=where, cost=cost.to_dict(), breakdown=breakdown))
    return cost


def _measure_protocol(ctx: GradeContext) -> tuple[ProtocolCost, dict]:
    with tempfile.TemporaryDirectory(prefix="calibrate-", dir=scratch()) as tmp:
        record, output = run_harness("calibrate", dict(kind="builtin", name="null"), ctx, Path(tmp),
                                     folder=[], deadline_s=ctx.limits.time_s,
                                     case=largest(list(ctx.cases)).to_dict(),
                                     **run_stage_again(ctx), **call_fields(ctx))
    if record is None and stopping():   # killed by the run's stop: no cost, and none saved for a resume
        raise Cancelled("the run is stopping: the protocol's calibration was stopped")
    if record is None or "protocol" not in record:
        ctx.progress.note(f"protocol calibration failed; times include the protocol's cost\n{output[-1500:]}")
        return ProtocolCost(), {}
    cost = ProtocolCost.from_dict(record["protocol"])
    ctx.progress.note(f"protocol calibrated: {cost.idle_ms:.3f} ms per call without GPU work, "
                      f"{cost.busy_ms:.3f} ms around {cost.busy_work_ms:.1f} ms of attention kernels "
                      f"(round trip {record['rtt_ms']:.3f} ms, GPU context switches, output copy), "
                      f"subtracted from every timed call; {ctx.cpus.describe()}")
    return cost, record.get("breakdown") or {}

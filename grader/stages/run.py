"""Run stage: each case once, driven by the harness in a sandboxed subject (run_cases: Ran), with
the rule for a machine too loaded to tell slow from hung (run_cases_under_load), and which cases
can run on this machine at all (select_cases)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import NamedTuple

from grader.build.stage import machine_load
from grader.common import config
from grader.common.status import Status
from grader.course.submission import Kind, Role, Submission
from grader.course.verdicts import BuildResult, CaseResult
from grader.isolation.procs import Cancelled, stopping
from grader.problem import Case, largest
from grader.report.feedback import cpu_note
from grader.stages.ahead import early
from grader.stages.context import GpuUnhealthy, GradeContext
from grader.stages.folders import forget_tuning, subject_folders, target_of
from grader.stages.harnesses import NotStarted, Prepared, Stages, harness_spec, run_once
from grader.stages.time import run_stage_fields, time_fields


def run_cases_under_load(sub: Submission, build: BuildResult, cases: list[Case], ctx: GradeContext,
                         work: Path, jit: Path | None = None, timed: Case | None = None,
                         prepared: "Prepared | None" = None) -> Ran:
    """run_cases, and the build stage's rule for a machine too busy to tell slow from hung
    (config.OVERLOADED_PER_CORE): a timeout on a machine that was overloaded before the cases
    started is run once more; a second one, the load again that high before it, is the machine's
    (environment_error: never scored). The load is read before each try, never during one: a
    hung submission's own threads cannot make its timeout the machine's."""
    load = machine_load()   # before: while the cases run, the submission adds to the load
    ran = run_cases(sub, build, cases, ctx, work, jit, timed, prepared)
    if not _timed_out(ran.runs) or load < config.OVERLOADED_PER_CORE:
        return ran
    if ran.stages is not None:
        ran.stages.close()
    ctx.progress.note(f"{sub.id}: a case timed out while the machine was overloaded (load "
                      f"{load:.1f} per core); running the cases again")
    load = min(load, machine_load())
    ran = run_cases(sub, build, cases, ctx, work, jit, timed)
    if _timed_out(ran.runs) and load >= config.OVERLOADED_PER_CORE:
        for r in ran.runs.values():
            if r["status"] == Status.TIMEOUT.value:
                r["status"] = Status.ENVIRONMENT_ERROR.value
                r["overloaded"] = True   # CaseResult.overloaded: the GPU worker grades it again
                r["message"] += (f" (twice, both times while the grading machine was overloaded, "
                                 f"load {load:.1f} per core: the machine's fault, not your "
                                 f"submission's; it will be graded again)")
    return ran


def overloaded(result) -> bool:
    """Whether a result is the machine's under load: an environment_error whose case the load
    rule ended (CaseResult.overloaded); the GPU worker grades it once more when the load has
    fallen (schedule/workers.py)."""
    return result.status is Status.ENVIRONMENT_ERROR and any(
        c.status is Status.ENVIRONMENT_ERROR and c.overloaded for c in result.cases)


def _timed_out(runs: dict) -> bool:
    return any(r.get("status") == Status.TIMEOUT.value for r in runs.values())


def let_go(stages: "Stages", jit: Path | None) -> None:
    """A run stage's harness and subject ended, and each of their processes exited
    (WarmHarness.close), before the stage lets go of its GPU's gate (gate.py's invariant: no
    process that ran a submission's code holds a CUDA context when a time stage may begin). What
    it tuned beside other submissions' run stages is forgotten (forget_tuning)."""
    stages.close()
    if stages.harness.left:
        raise GpuUnhealthy(f"processes {sorted(stages.harness.left)} of a run stage were still "
                           f"running 60 s after they were killed: no time stage can begin beside them")
    forget_tuning(jit)


def select_cases(sub: Submission, ctx: GradeContext) -> tuple[list[Case], list[CaseResult], list[str]]:
    """Which cases can run here: all of them with a GPU; without one, small cases of Python
    submissions only."""
    if ctx.device.cuda:
        return list(ctx.cases), [], []
    if sub.kind is Kind.CUDA:
        return [], [CaseResult(c.id, Status.NOT_RUN, "not run: no CUDA device", c.hidden)
                    for c in ctx.cases], ["compile-checked only: no CUDA device"]
    small = [c for c in ctx.cases if c.flops <= config.CPU_MAX_FLOPS]
    big = [CaseResult(c.id, Status.NOT_RUN, "not run: too large for the CPU (no CUDA device)",
                      c.hidden) for c in ctx.cases if c.flops > config.CPU_MAX_FLOPS]
    # No note yet: what ran is known once the cases have (ran_where). A case given to the CPU
    # need not run there: TileLang, with no CPU interpreter, compiles it and runs nothing.
    return small, big, []


def ran_where(ctx: GradeContext, cases: list[CaseResult]) -> list[str]:
    """Without a CUDA device, the note that says how many cases ran, on the CPU, when any did
    (feedback.cpu_note: the label CPU-PASS reads it); none when none ran."""
    ran = sum(c.status is not Status.NOT_RUN for c in cases)
    return [cpu_note(ran, len(cases))] if ran and not ctx.device.cuda else []


class Ran(NamedTuple):
    """What a run stage gives: a record per case, {'status': 'pass' (ran; to be checked) |
    'runtime_error' | 'timeout', 'message', ...}; the log text; the Stages when its subject stays
    for the time stage (else None); and the seconds of each of results.RUN_PHASES that the
    harness measured ({} when it failed)."""
    runs: dict[str, dict]
    output: str
    stages: Stages | None
    phases_s: dict[str, float]


def run_cases(sub: Submission, build: BuildResult, cases: list[Case], ctx: GradeContext,
              work: Path, jit: Path | None = None, timed: Case | None = None,
              prepared: "Prepared | None" = None) -> Ran:
    """Each case once, driven by the harness. With `timed` (one of `cases`), the harness stays
    with its subject for the time stage: Ran.stages, to be timed or closed; `prepared`: that
    harness and subject, started before this submission's turn (Lookahead), told to go on now
    (NotStarted if its harness ends with no record). Meanwhile the worker's next submissions are
    begun (Lookahead.begin)."""
    stages = None
    if prepared is not None:
        stages = prepared.stages
        stages.go(ctx.protocol)
    elif timed is not None and timed in cases:
        spec, spec_path = stages_spec(sub, build, cases, ctx, work, jit, timed)
        stages = Stages(spec, spec_path, env=ctx.env, cpus=ctx.run_cpus)
    if stages is not None:
        try:
            early().begin(ctx, timed)
        except BaseException:   # Cancelled: the run is stopping
            stages.close()
            raise
        record, output = stages.ran(ctx.limits.run_s + 300)
        if record is None and prepared is not None:   # its harness gave up (subject_start._give_up)
            stages.close()
            if stopping():   # killed by the run's stop: not graded, and not started anew
                raise Cancelled("the run is stopping: a run begun early was stopped")
            raise NotStarted(output)
    else:
        spec, spec_path = harness_spec("run", target_of(sub, build), ctx, work,
                                       folder=subject_folders(sub, build), deadline_s=ctx.limits.run_s,
                                       jit=jit, **run_stage_fields(cases, ctx))
        record, output = run_once(spec, spec_path, env=ctx.env, cpus=ctx.cpus)
    if record is None:
        message = f"grader error: the harness failed; tell the instructor\n{output[-3000:]}"
        return Ran({c.id: dict(status="runtime_error", message=message) for c in cases}, output,
                   stages, {})
    return Ran(record["cases"], output, stages, record.get("phases_s") or {})


def stages_spec(sub: Submission, build: BuildResult, cases: list[Case], ctx: GradeContext,
                work: Path, jit: Path | None, timed: Case, **fields) -> tuple[dict, Path]:
    """The spec of a run stage that stays for the time stage (harness.run_then_time)."""
    return harness_spec("run_then_time", target_of(sub, build), ctx, work, folder=subject_folders(sub, build),
                        deadline_s=ctx.limits.run_s, jit=jit, time=time_fields(timed, ctx, work),
                        **run_stage_fields(cases, ctx), **fields)


@dataclasses.dataclass(frozen=True)
class CasePlan:
    """Which of the run's cases one submission runs here (select_cases), which of them is timed
    (the largest, on a GPU), and the name of its logs."""
    runnable: list[Case]
    skipped: list[CaseResult]   # NOT_RUN here: each with why
    notes: list[str]
    timed: Case | None
    log_id: str

    def nothing_runs(self, sub: Submission) -> str:
        """The verdict's text when no case can run here."""
        return ("compiled; not run: no CUDA device" if sub.kind is Kind.CUDA
                else "imported; no case small enough to run without a GPU")


def plan_cases(sub: Submission, ctx: GradeContext) -> CasePlan:
    """`sub`'s CasePlan. The solution is graded on every GPU of the run: each GPU's logs of it
    apart."""
    runnable, skipped, notes = select_cases(sub, ctx)
    log_id = f"{sub.id}.{ctx.gpu_tag}" if ctx.gpu_tag and sub.role is Role.BASELINE else sub.id
    timed = largest(list(ctx.cases)) if ctx.device.cuda else None
    return CasePlan(runnable, skipped, notes, timed, log_id)

"""grade_submission: one submission's stages after its build, top to bottom.

    grade_submission       its turn: its run begun early (a Prepared), or folders of its own;
                           what is left after its time stage may be Left behind (behind.py)
      _grade_built         the stages, in order, each returning a typed result:
        Sheet.start        what every result carries (judge.py)
        the build          a build that did not pass is the verdict (BuildResult)
        plan_cases         which cases run here and which is timed (run.py: CasePlan)
        run_stage          each case once (run.py: Ran's records); again alone if it failed
                           beside other submissions' code
        time_largest_case  the time stage, when every case ran and launched only what it may
                           (time.py: TimedRun)
        -- hand-over --    what follows may run beside the next submission's run stage
        check_cases        the check stage (check.py: a CaseResult per case)
        judge_cases        the cases' verdict and the kernels they launched (CaseVerdict)
        judge_timed        the result, with what the timed calls show (SubmissionResult)

Scheduling is not here: which GPU, which lane, what was begun early and what is left behind come
in through the context (ctx.gate) and the thread's EarlyRuns (ahead.py) and Behind (behind.py),
filled in by grader/schedule/.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from grader.common.status import Status
from grader.course.results import SubmissionResult
from grader.course.submission import Submission
from grader.course.verdicts import BuildResult
from grader.stages.ahead import early
from grader.stages.behind import Left, Steps, behind, to_the_end
from grader.stages.check import (BESIDE_CHECK_RETRY, CHECKED_IN_COMPANY, CROWDED_RETRY,
                                 check_cases, checker_broke, crowded, is_broken)
from grader.stages.clock import StageClock, held
from grader.stages.context import GradeContext
from grader.stages.early import current_timer
from grader.stages.folders import (jit_cache, jit_report, save_log, subject_folders, target_of,
                                   work_folder)
from grader.stages.harnesses import NotStarted, Prepared, Stages, TimeSubject, harness_said
from grader.stages.health import ensure_gpu_healthy
from grader.stages.judge import (Sheet, judge_cases, judge_timed, launch_findings, over_quota,
                                 verdict_text)
from grader.stages.run import CasePlan, let_go, plan_cases, run_cases, run_cases_under_load
from grader.stages.time import TimedLater, TimedRun, time_subject, time_target
from grader.stages.turns import alone, shared
from grader.trusted import identity
from grader.trusted.correctness import launched_of


def grade_submission(sub: Submission, build: BuildResult, ctx: GradeContext,
                     source: str = "") -> SubmissionResult | Left:
    """Everything after the build, for one submission; never raises for the submission's faults.
    `source`: its folder's sources, read before any of its code ran (own kernel names).

    Its wall time is the build's plus its own stages', not the time it waited for the GPU.
    In a GPU worker, its run may have begun during the submission before (Lookahead), and what
    is left after its time stage may be Left to the lane's Behind (behind.py): then that is
    returned, and the result comes from Left.finish."""
    steps = grading(sub, build, ctx, source)
    if not behind().takes():
        return to_the_end(steps)
    try:
        steps.send(None)   # to its hand-over, or to its end
    except StopIteration as done:
        return done.value
    return Left(steps, sub.id)


def grading(sub: Submission, build: BuildResult, ctx: GradeContext, source: str = "") -> Steps:
    """grade_submission's stages as steps (behind.Steps): they stop once, at most, after the
    time stage, where what is left may go on beside the next submission's run stage."""
    turn = time.monotonic()
    waits = early().begun(sub)   # only a run begun early is waited for ("wait" in stage_s)
    prepared = early().claim(sub, ctx.gate)   # waits for its preparation to end, if it has not
    if prepared is not None:
        try:
            with prepared.folders:
                result = yield from _grade_built(sub, build, ctx, source, prepared.jit, prepared,
                                                 time.monotonic() - turn)
                return _graded(result, ctx, prepared.jit)
        except NotStarted as gone:   # graded anew below, in new folders, its time counted as waiting
            waits = True
            ctx.progress.note(f"{sub.id}: its run begun early did not start; running it anew"
                              + harness_said(gone.output))
    # Nothing else counts as waiting: on a loaded machine even a turn with nothing begun early
    # takes over a millisecond to get here (CI's 2-core machine), and making the JIT folder is
    # the run stage's work.
    waited_s = time.monotonic() - turn if waits else 0.0
    with jit_cache(sub, ctx.limits, build) as jit:
        result = yield from _grade_built(sub, build, ctx, source, jit, waited_s=waited_s)
        return _graded(result, ctx, jit)


def _graded(result: SubmissionResult, ctx: GradeContext, jit: Path | None) -> SubmissionResult:
    """`result`, its JIT folder's line added to the instructor's run log (jit_report)."""
    line = jit_report(jit)
    if line:
        path = ctx.out_dir / "logs" / f"{result.id}.run.log"
        try:
            with open(path, "a", encoding="utf-8") as log:
                log.write(line)
        except OSError:   # a diagnostic: never the submission's result
            pass
    return over_quota(result, jit)


def _grade_built(sub: Submission, build: BuildResult, ctx: GradeContext, source: str,
                 jit: Path | None, prepared: Prepared | None = None,
                 waited_s: float = 0.0) -> Steps:
    """The stages after the build, in order, with the submission's JIT cache folder (jit_cache)
    and, when its run was begun early, the Prepared (its work folder and Stages); waited_s: how
    long its turn waited for a preparation to end (StageClock "wait").

    The time stage comes before the check stage: a submission is timed once every case ran and
    launched only what it may (the check then decides whether the time counts), so that its
    check can be left behind its turn (behind.py). A time stage that finds its outputs wrong
    stops within a few calls (config.TIMING_WRONG_STOP)."""
    sheet = Sheet.start(sub, build, ctx, source, waited_s)
    if build.status is not Status.PASS:
        return sheet.finish(build.status, build.message, cases=[])
    plan = plan_cases(sub, ctx)
    if not plan.runnable:
        return sheet.finish(Status.NOT_RUN, plan.nothing_runs(sub), cases=plan.skipped,
                            notes=plan.notes)
    folder = contextlib.nullcontext(prepared.work) if prepared is not None else work_folder(sub)
    with folder as tmp, contextlib.ExitStack() as later:
        work = Path(tmp)
        timer = _own_timer(sub, build, ctx, plan, work, jit, prepared, later)
        runs, stages = run_stage(sub, build, ctx, plan, work, jit, prepared, sheet.clock, later)
        timed_run = None
        if plan.timed is not None and all_ran(runs) and not launch_flag(sub, build, ctx, source,
                                                                         plan, runs):
            timed_run = time_largest_case(sub, build, ctx, plan, jit, stages, timer, sheet.clock)
        elif stages is not None:
            stages.close()   # not timed: its subject goes before the GPU's health is checked
        if failed_to_run_any(runs):
            behind().wait()   # (before the gate, as in time_largest_case)
            with alone(ctx.gate):   # no other submission's code beside the probe: its verdict is the GPU's
                ensure_gpu_healthy(ctx)
        left = yield   # what is left may go on beside the next submission's run stage
        with held(shared, ctx.gate, sheet.clock) as company:
            checked = check_cases(sub, plan.runnable, runs, ctx, work, sheet.clock)
        if isinstance(timed_run, TimedLater):   # its harness's spot checks ran beside the check
            timed_run = timed_run.result()
        if checker_broke(checked):
            if left or company.crowded:   # beside another submission's code: the machine's
                return sheet.finish(Status.ENVIRONMENT_ERROR, CHECKED_IN_COMPANY,
                                    cases=[c if not is_broken(c) else crowded(c) for c in checked])
            with alone(ctx.gate):
                ensure_gpu_healthy(ctx)
        judged = judge_cases(sub, build, ctx, source, plan, checked)
        if judged.flagged:
            return sheet.finish(Status.FLAGGED, judged.flagged, cases=judged.cases,
                                notes=judged.notes, kernels=judged.kernels)
        if judged.status is not Status.PASS or timed_run is None:
            if judged.status is Status.PASS:
                judged.notes.append("not timed: no CUDA device")
            return sheet.finish(judged.status, verdict_text(judged.status, judged.cases, None),
                                cases=judged.cases, notes=judged.notes, kernels=judged.kernels)
        return judge_timed(sheet, sub, build, ctx, source, plan.timed, judged, timed_run)


def _own_timer(sub: Submission, build: BuildResult, ctx: GradeContext, plan: CasePlan, work: Path,
               jit: Path | None, prepared: Prepared | None,
               later: contextlib.ExitStack) -> TimeSubject | None:
    """Where run stages share the GPU (ctx.gate), the time stage runs on a subject of its own,
    begun now (or with its run, when that was begun early) and closed with the stages."""
    if ctx.gate is None or plan.timed is None:
        return None
    timer = prepared.timer if prepared is not None and prepared.timer is not None \
        else time_subject(sub, build, ctx, plan.timed, work, jit)
    later.callback(timer.close)
    return timer


def run_stage(sub: Submission, build: BuildResult, ctx: GradeContext, plan: CasePlan, work: Path,
              jit: Path | None, prepared: Prepared | None, clock: StageClock,
              later: contextlib.ExitStack) -> tuple[dict[str, dict], Stages | None]:
    """The run stage: each case's record (run.Ran.runs), and the Stages whose subject stays for
    the time stage (None where run stages share the GPU: that subject is gone before the gate is
    let go, and the time stage has its own). A case that failed while other submissions' code
    shared the GPU (their run stages, or a check left behind) runs again with the GPU to itself
    before it counts."""
    with held(shared, ctx.gate, clock) as company:
        beside_check = behind().busy()   # a check left behind runs beside this run stage
        ctx.progress.stage(sub.id, "run")
        clock.start("run")
        runs, run_output, stages, phases_s = run_cases_under_load(
            sub, build, plan.runnable, ctx, work, jit, plan.timed, prepared)
        if stages is not None and ctx.gate is not None:
            let_go(stages, jit)   # gone before the gate is let go: timed on its own subject
            stages = None
        elif stages is not None:
            later.callback(stages.close)
        clock.parts("run", phases_s)
        save_log(ctx, plan.log_id, "run", run_output)
        clock.stop()
    again = CROWDED_RETRY if company.crowded else BESIDE_CHECK_RETRY if beside_check else ()
    if any(r.get("status") in again for r in runs.values()):
        ctx.progress.note(f"{sub.id}: a case failed while another submission's code shared "
                          f"the GPU; running its cases again alone")
        if stages is not None:
            stages.close()   # timed, if at all, on a new subject
            stages = None
        behind().wait()   # before the gate: a check behind may need it shared to end
        with alone(ctx.gate):
            clock.start("run")
            runs, run_output, _, _ = run_cases(sub, build, plan.runnable, ctx, work, jit)
            save_log(ctx, plan.log_id, "run", run_output)
            clock.stop()
    return runs, stages


def all_ran(runs: dict[str, dict]) -> bool:
    """Whether every case ran and returned an output that can be checked (no problem)."""
    return all(r.get("status") == "pass" and not r.get("problem") for r in runs.values())


def failed_to_run_any(runs: dict[str, dict]) -> bool:
    """Whether a case raised, crashed or hung: the GPU's health is checked before anything else
    runs on it."""
    return any(r.get("status") in (Status.RUNTIME_ERROR.value, Status.TIMEOUT.value)
               for r in runs.values())


def launch_flag(sub: Submission, build: BuildResult, ctx: GradeContext, source: str,
                plan: CasePlan, runs: dict[str, dict]) -> str:
    """judge_cases' flag for library kernels, from the run stage's records alone: such a
    submission is not timed."""
    if ctx.calibration:
        return ""
    own = identity.own_kernels(source, sub.kind.value, getattr(build, "kernels", None))
    return launch_findings([(c.id, launched_of(runs[c.id])) for c in plan.runnable], source, own,
                           ctx)


def time_largest_case(sub: Submission, build: BuildResult, ctx: GradeContext, plan: CasePlan,
                      jit: Path | None, stages: Stages | None, timer: TimeSubject | None,
                      clock: StageClock) -> TimedRun | tuple[Status, str] | TimedLater:
    """The time stage, with the GPU to itself: on the run stage's subject (`stages`), on its own
    prepared one (`timer`), or on a new one."""
    timer = current_timer(timer, ctx)
    if timer is not None:
        timer.settle()   # its preparation ends before its turn, not in it
    behind().wait()   # no check left behind runs beside a timed call
    with held(alone, ctx.gate, clock):
        ctx.progress.stage(sub.id, "time")
        clock.start("time")
        timed_run = time_target(target_of(sub, build), plan.timed, ctx,
                                folder=subject_folders(sub, build), log_name=plan.log_id, jit=jit,
                                stages=stages, timer=timer, later=True)
        clock.stop()
    return timed_run

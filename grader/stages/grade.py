"""grade_submission: one submission's stages after its build, top to bottom.

    grade_submission       its turn: its run begun early (a Prepared), or folders of its own
      _grade_built         the stages, in order, each returning a typed result:
        Sheet.start        what every result carries (judge.py)
        the build          a build that did not pass is the verdict (BuildResult)
        plan_cases         which cases run here and which is timed (run.py: CasePlan)
        run_and_check      the run stage, then the check stage (run.py: Ran; check.py:
                           a CaseResult per case); again alone if it failed in company
        judge_cases        the cases' verdict and the kernels they launched (CaseVerdict)
        time_largest_case  the time stage, when every case passed (time.py: TimedRun)
        judge_timed        the result, with what the timed calls show (SubmissionResult)

Scheduling is not here: which GPU, which lane, what was begun early come in through the context
(ctx.gate) and the thread's EarlyRuns (ahead.py), filled in by grader/schedule/.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from grader.common.status import Status
from grader.course.results import SubmissionResult
from grader.course.submission import Submission
from grader.course.verdicts import BuildResult, CaseResult
from grader.stages.ahead import early
from grader.stages.check import CROWDED_RETRY, check_cases, failed_to_run
from grader.stages.clock import StageClock, held
from grader.stages.context import GradeContext
from grader.stages.early import current_timer
from grader.stages.folders import (jit_cache, jit_report, save_log, subject_folders, target_of,
                                   work_folder)
from grader.stages.harnesses import NotStarted, Prepared, Stages, TimeSubject, harness_said
from grader.stages.health import ensure_gpu_healthy
from grader.stages.judge import Sheet, judge_cases, judge_timed, over_quota, verdict_text
from grader.stages.run import CasePlan, let_go, plan_cases, run_cases, run_cases_under_load
from grader.stages.time import TimedRun, time_subject, time_target
from grader.stages.turns import alone, shared


def grade_submission(sub: Submission, build: BuildResult, ctx: GradeContext,
                     source: str = "") -> SubmissionResult:
    """Everything after the build, for one submission; never raises for the submission's faults.
    `source`: its folder's sources, read before any of its code ran (own kernel names).

    Its wall time is the build's plus its own stages', not the time it waited for the GPU.
    In a GPU worker, its run may have begun during the submission before (Lookahead)."""
    turn = time.monotonic()
    waits = early().begun(sub)   # only a run begun early is waited for ("wait" in stage_s)
    prepared = early().claim(sub, ctx.gate)   # waits for its preparation to end, if it has not
    if prepared is not None:
        try:
            with prepared.folders:
                return _graded(_grade_built(sub, build, ctx, source, prepared.jit, prepared,
                                            time.monotonic() - turn), ctx, prepared.jit)
        except NotStarted as gone:   # graded anew below, in new folders, its time counted as waiting
            waits = True
            ctx.progress.note(f"{sub.id}: its run begun early did not start; running it anew"
                              + harness_said(gone.output))
    # Nothing else counts as waiting: on a loaded machine even a turn with nothing begun early
    # takes over a millisecond to get here (CI's 2-core machine), and making the JIT folder is
    # the run stage's work.
    waited_s = time.monotonic() - turn if waits else 0.0
    with jit_cache(sub, ctx.limits, build) as jit:
        return _graded(_grade_built(sub, build, ctx, source, jit, waited_s=waited_s), ctx, jit)


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
                 waited_s: float = 0.0) -> SubmissionResult:
    """The stages after the build, in order, with the submission's JIT cache folder (jit_cache)
    and, when its run was begun early, the Prepared (its work folder and Stages); waited_s: how
    long its turn waited for a preparation to end (StageClock "wait")."""
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
        checked, stages = run_and_check(sub, build, ctx, plan, work, jit, prepared, sheet.clock,
                                        later)
        judged = judge_cases(sub, build, ctx, source, plan, checked)
        if stages is not None and (judged.status is not Status.PASS or plan.timed is None):
            stages.close()   # not timed: its subject goes before the GPU's health is checked
        if failed_to_run(checked):
            with alone(ctx.gate):   # no other submission's code beside the probe: its verdict is the GPU's
                ensure_gpu_healthy(ctx)
        if judged.flagged:
            return sheet.finish(Status.FLAGGED, judged.flagged, cases=judged.cases,
                                notes=judged.notes, kernels=judged.kernels)
        if judged.status is not Status.PASS or plan.timed is None:
            if judged.status is Status.PASS:
                judged.notes.append("not timed: no CUDA device")
            return sheet.finish(judged.status, verdict_text(judged.status, judged.cases, None),
                                cases=judged.cases, notes=judged.notes, kernels=judged.kernels)
        timed_run = time_largest_case(sub, build, ctx, plan, jit, stages, timer, sheet.clock)
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


def run_and_check(sub: Submission, build: BuildResult, ctx: GradeContext, plan: CasePlan,
                  work: Path, jit: Path | None, prepared: Prepared | None, clock: StageClock,
                  later: contextlib.ExitStack) -> tuple[list[CaseResult], Stages | None]:
    """The run stage, then the check stage: a CaseResult per case, and the Stages whose subject
    stays for the time stage (None where run stages share the GPU: that subject is gone before
    the gate is let go, and the time stage has its own). A case that failed while other
    submissions' run stages shared the GPU runs again, with the GPU to itself, before it counts."""
    with held(shared, ctx.gate, clock) as company:
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
        checked = check_cases(sub, plan.runnable, runs, ctx, work, clock)
    if company.crowded and any(c.status in CROWDED_RETRY for c in checked):
        ctx.progress.note(f"{sub.id}: a case failed while other submissions' run stages "
                          f"shared the GPU; running its cases again alone")
        with alone(ctx.gate):
            clock.start("run")
            runs, run_output, _, _ = run_cases(sub, build, plan.runnable, ctx, work, jit)
            save_log(ctx, plan.log_id, "run", run_output)
            checked = check_cases(sub, plan.runnable, runs, ctx, work, clock)
    return checked, stages


def time_largest_case(sub: Submission, build: BuildResult, ctx: GradeContext, plan: CasePlan,
                      jit: Path | None, stages: Stages | None, timer: TimeSubject | None,
                      clock: StageClock) -> TimedRun | tuple[Status, str]:
    """The time stage, with the GPU to itself: on the run stage's subject (`stages`), on its own
    prepared one (`timer`), or on a new one."""
    timer = current_timer(timer, ctx)
    if timer is not None:
        timer.settle()   # its preparation ends before its turn, not in it
    with held(alone, ctx.gate, clock):
        ctx.progress.stage(sub.id, "time")
        clock.start("time")
        timed_run = time_target(target_of(sub, build), plan.timed, ctx,
                                folder=subject_folders(sub, build), log_name=plan.log_id, jit=jit,
                                stages=stages, timer=timer)
        clock.stop()
    return timed_run

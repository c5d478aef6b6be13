"""A submission's run stage begun before its turn (prepare: a Prepared whose subject has started
CUDA and waits to load the submission). Which submissions, and when, is scheduling's
(grader/schedule/lookahead.py)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from grader.common.status import Status
from grader.course.submission import Kind, Submission
from grader.course.verdicts import BuildResult
from grader.problem import Case
from grader.stages.context import GradeContext, health_checks_of
from grader.stages.folders import jit_cache, work_folder
from grader.stages.harnesses import Prepared, Stages, TimeSubject
from grader.stages.run import select_cases, stages_spec
from grader.stages.time import time_subject


def prepare(sub: Submission, build: BuildResult, ctx: GradeContext, timed: Case) -> Prepared | None:
    """`sub`'s run stage begun now, its subject prepared but loading nothing (Prepared); None
    when it would not run to a time stage (failed build, not every case runnable here)."""
    runnable, _, _ = select_cases(sub, ctx)
    if build.status is not Status.PASS or sub.kind not in (Kind.PYTHON, Kind.CUDA) or timed not in runnable:
        return None
    checks = health_checks_of(ctx)   # as it was before any of it began
    folders = contextlib.ExitStack()
    try:
        jit = folders.enter_context(jit_cache(sub, ctx.limits, build))
        work = Path(folders.enter_context(work_folder(sub)))
        spec, spec_path = stages_spec(sub, build, runnable, ctx, work, jit, timed, prepare=True)
        stages = Stages(spec, spec_path, env=ctx.env, cpus=ctx.run_cpus, spare=False)
        folders.callback(stages.close, wait_s=0)   # (a no-op once closed)
        timer = time_subject(sub, build, ctx, timed, work, jit) if ctx.gate is not None else None
    except BaseException:
        folders.close()
        raise
    return Prepared(sub, work, jit, stages, folders, timer=timer, health_checks=checks)


def current_timer(timer: "TimeSubject | None", ctx: GradeContext) -> "TimeSubject | None":
    """`timer`, unless a health check of its GPU began after it was begun (another lane's crash,
    beside which it started CUDA): then it is closed, and None (timed on a new subject)."""
    if timer is not None and timer.health_checks != health_checks_of(ctx):
        timer.close()
        return None
    return timer



"""A PyTorch baseline row, timed by the same harness and subject as a submission."""

from __future__ import annotations

import time

from grader.common.status import Status
from grader.course.results import SubmissionResult
from grader.problem import BASELINES, largest
from grader.stages.context import GradeContext, now
from grader.stages.time import TimedRun, time_target


def grade_baseline(name: str, ctx: GradeContext) -> SubmissionResult:
    """A PyTorch baseline row: its code runs in a subject like a submission's, timed by the same
    harness on the largest case."""
    started = time.monotonic()
    baseline = BASELINES[name]
    base = dict(id=name, label=baseline.label, kind="builtin", role="baseline")
    if not ctx.device.cuda:
        return SubmissionResult(**base, status=Status.NOT_RUN, message="not run: no CUDA device",
                                graded_at=now())
    case = largest(list(ctx.cases))
    timed = time_target(dict(kind="builtin", name=name), case, ctx, folder=[])
    if isinstance(timed, TimedRun):
        timing = timed.stats
        return SubmissionResult(**base, status=Status.PASS,
                                message=f"median {timing.median_ms:.3f} ms ({timing.tflops:.1f} TFLOP/s)",
                                timed_case=case.id, timing=timing, graded_at=now(),
                                wall_s=round(time.monotonic() - started, 2))
    status, message = timed
    return SubmissionResult(**base, status=status, message=message, graded_at=now(),
                            wall_s=round(time.monotonic() - started, 2))

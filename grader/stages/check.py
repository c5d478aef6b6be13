"""Check stage: the outputs of the cases that ran, checked against the reference by the warm
checker (grader/trusted/correctness.py): a CaseResult per case."""

from __future__ import annotations

from pathlib import Path

from grader.common.status import Status
from grader.course.submission import Submission
from grader.course.verdicts import CaseResult
from grader.problem import Case
from grader.stages.clock import StageClock
from grader.stages.context import GradeContext
from grader.trusted.correctness import check_outputs, launched_of


def check_cases(sub: Submission, cases: list[Case], runs: dict, ctx: GradeContext, work: Path,
           clock: "StageClock") -> list[CaseResult]:
    """The check stage: the outputs of the cases that ran, checked by the warm checker; a
    CaseResult per case (a case that did not run keeps its run's verdict)."""
    if any(r["status"] == "pass" for r in runs.values()):
        ctx.progress.stage(sub.id, "check")
        clock.start("check")
        checked = check_outputs(cases, runs, out_dir=work, device=ctx.device_name,
                                limits=ctx.limits, env=ctx.env, precision=ctx.precision)
    else:
        checked = [CaseResult(c.id, Status(runs[c.id]["status"]), runs[c.id]["message"],
                              c.hidden, run_s=runs[c.id].get("elapsed_s"),
                              launched=launched_of(runs[c.id]),
                              overloaded=bool(runs[c.id].get("overloaded"))) for c in cases]
    clock.stop()
    return checked


# A case that ended so while other submissions' run stages shared the GPU is run again alone:
# they could have taken its memory, its time or the machine's CPUs (the load rule's verdict).
CROWDED_RETRY = (Status.RUNTIME_ERROR, Status.TIMEOUT, Status.ENVIRONMENT_ERROR)


def failed_to_run(checked: list[CaseResult]) -> bool:
    return any(c.status in (Status.RUNTIME_ERROR, Status.TIMEOUT) for c in checked)


def in_case_order(results: list[CaseResult], cases) -> list[CaseResult]:
    order = {c.id: i for i, c in enumerate(cases)}
    return sorted(results, key=lambda r: order.get(r.case, len(order)))

"""Check stage: the outputs of the cases that ran, checked against the reference by the warm
checker (grader/trusted/correctness.py): a CaseResult per case."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from grader.common.status import Status
from grader.course.submission import Submission
from grader.course.verdicts import CaseResult
from grader.problem import Case
from grader.stages.clock import StageClock
from grader.stages.context import GradeContext
from grader.trusted.correctness import CHECKER_BROKE, check_outputs, launched_of


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
# A case that raised beside a check left behind its turn (stages/behind.py) runs again once that
# check is done: the checker holds a few GiB of the GPU's memory for about a second. Not one that
# timed out: a case's limit is 30 s at least, and a hang would cost its limit twice.
BESIDE_CHECK_RETRY = (Status.RUNTIME_ERROR,)


def in_case_order(results: list[CaseResult], cases) -> list[CaseResult]:
    order = {c.id: i for i, c in enumerate(cases)}
    return sorted(results, key=lambda r: order.get(r.case, len(order)))


def is_broken(case: CaseResult) -> bool:
    """Whether this case's check failed in the checker itself, not in the submission's output."""
    return case.status is Status.RUNTIME_ERROR and case.message.startswith(CHECKER_BROKE)


def checker_broke(checked: list[CaseResult]) -> bool:
    return any(is_broken(c) for c in checked)


# A check that broke beside another submission's code (a check left behind its turn, or lanes):
# that code may have taken the GPU's memory or time, so it is the machine's, graded again alone
# at the end of the run (CaseResult.overloaded: schedule/workers.py's again_later).
CHECKED_IN_COMPANY = ("the checker failed while another submission's code shared the GPU: the "
                      "grading machine's fault, not your submission's; it will be graded again")


def crowded(case: CaseResult) -> CaseResult:
    """A case whose check broke in company, as the machine's (CHECKED_IN_COMPANY)."""
    return dataclasses.replace(case, status=Status.ENVIRONMENT_ERROR, overloaded=True,
                               message=f"{CHECKED_IN_COMPANY}\n{case.message}")

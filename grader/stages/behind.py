"""A submission's grading left behind its turn (issue 32): once its time stage is done, what is
left of it, the check stage and the verdict, needs the GPU only as a trusted checker does, never
alone. A GPU worker's lane lets it run beside the next submission's run stage (Left, handed to
the lane's Behind), and waits for it before anything that needs the GPU alone: a time stage, a
health check, a baseline.

The invariant: no timed call runs while a check left behind runs (Behind.wait before every time
stage), and a check never sees another submission's outputs (its work folder is its own). What
a check beside another submission's run stage may suffer is that submission's load on the GPU:
a check that breaks there (the checker died, or ran past its limit) is not a verdict but the
machine's (environment_error, graded again alone at the end of the run, stages/grade.py), and a
case that raised beside a check runs again once the check is done (check.BESIDE_CHECK_RETRY).

The stages see only the calling thread's Behind: the default here takes nothing (outside a lane:
the failed builds written after a Ctrl-C, tests calling grade_submission; everything runs to its
end in its turn); every lane installs its own (grader/schedule/behind.py), and `grade`, `check`,
the service's and Slurm's runs all grade in lanes (schedule/workers.grade_all).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING

from grader.stages.turns import PerThread

if TYPE_CHECKING:
    from grader.course.results import SubmissionResult

# A submission's grading as steps (grade.grading): it yields once, at most, where what is left
# may run beside the next submission's run stage; it is sent True when it goes on there (left
# behind), None when in its turn; its return value is the result.
Steps = Generator[None, "bool | None", "SubmissionResult"]


def to_the_end(steps: Steps) -> SubmissionResult:
    """Drive `steps` to the end here, in the submission's turn, and return the result."""
    try:
        while True:
            steps.send(None)
    except StopIteration as done:
        return done.value


class Left:
    """What is left of one submission's grading after its turn (its steps, stopped at their
    hand-over): finished elsewhere (finish), or let go with its folders (drop)."""

    def __init__(self, steps: Steps, sub_id: str):
        self.steps, self.sub_id = steps, sub_id

    def finish(self) -> SubmissionResult:
        """Drive what is left to the end (on the lane's Behind thread) and return the result."""
        try:
            while True:
                self.steps.send(True)
        except StopIteration as done:
            return done.value

    def drop(self) -> None:
        """Never finished (the run stops): its folders go, its result is not written."""
        self.steps.close()


class Behind:
    """The calling thread's work left behind its turn: none here. A lane's (schedule/behind.py)
    overrides each method."""

    def takes(self) -> bool:
        """Whether a submission's grading may be left here after its time stage."""
        return False

    def busy(self) -> bool:
        """Whether a check left behind is running now (beside the caller's run stage)."""
        return False

    def wait(self) -> None:
        """Until nothing left behind is running: before a time stage, a health check, a baseline.
        Raises what stopped it (the run stopping, an unhealthy GPU)."""


_BEHIND = PerThread(Behind)


def behind() -> Behind:
    """The calling thread's work left behind its turn."""
    return _BEHIND.mine()


def install_behind(work: Behind) -> None:
    """The calling thread's work left behind is `work`'s from now (a GPU worker's lane)."""
    _BEHIND.install(work)


def forget_behind() -> None:
    _BEHIND.forget()

"""Runs begun ahead of their turn, as the stages see them: the calling thread's EarlyRuns.

A stage asks whether a submission's run was begun early (begun, claim), lets the next ones begin
while its run stage runs (begin), and lets them all go after a crash (drop). Scheduling fills it
in from outside: each GPU worker's lane installs its Lookahead (grader/schedule/lookahead.py) for
its thread. Elsewhere (a student's check, the tests) nothing is begun early: the EarlyRuns here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from grader.stages.turns import Gate, PerThread

if TYPE_CHECKING:
    from grader.course.submission import Submission
    from grader.problem import Case
    from grader.stages.context import GradeContext
    from grader.stages.harnesses import Prepared


class EarlyRuns:
    """A thread's runs begun before their turn: none (the default, wherever no GPU worker's lane
    installed its Lookahead: schedule/lookahead.py overrides every method)."""

    def begun(self, sub: Submission) -> bool:
        """Whether a run of `sub` was begun early (its turn then waits for it)."""
        return False

    def claim(self, sub: Submission, gate: Gate | None = None) -> Prepared | None:
        """`sub`'s run begun early, ready for its turn, or None."""
        return None

    def begin(self, ctx: GradeContext, timed: Case | None) -> None:
        """Begin the next submissions' runs while this one's run stage runs."""

    def drop(self) -> None:
        """Let every run begun early go (a crash beside them: they start afresh)."""

    def settle(self) -> None:
        """Wait until every run begun early has ended its preparation."""


_EARLY = PerThread(EarlyRuns)


def early() -> EarlyRuns:
    """The calling thread's runs begun early."""
    return _EARLY.mine()


def install_early(runs: EarlyRuns) -> None:
    """The calling thread's runs begun early are `runs` from now (a GPU worker's lane)."""
    _EARLY.install(runs)


def forget_early() -> None:
    """The calling thread goes back to none begun early (the lane's end)."""
    _EARLY.forget()

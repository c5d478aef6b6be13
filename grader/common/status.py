"""The one status vocabulary, used by the JSON results, the HTML page and the CSV."""

from __future__ import annotations

import enum


class Status(str, enum.Enum):
    BUILD_ERROR = "build_error"      # did not compile (CUDA) or import (Python)
    RUNTIME_ERROR = "runtime_error"  # raised, crashed, or returned something unusable
    TIMEOUT = "timeout"              # a stage ran past its wall-clock limit
    MISMATCH = "mismatch"            # ran, but an output is outside the tolerance
    FLAGGED = "flagged"              # caught doing something other than the assignment
    REVIEW = "review"                # passed, but uses code the grader cannot account for: not
                                     # ranked until an instructor clears it (grader/course/review.py)
    NOT_RUN = "not_run"              # needed hardware this machine lacks (no CUDA device)
    ENVIRONMENT_ERROR = "environment_error"  # the grading machine failed, not the submission
    NO_RESULT = "no_result"          # on the run's roster, but its result file is missing or unreadable
    PASS = "pass"                    # every case that was run is within the tolerance

    def __str__(self) -> str:
        return self.value

    @property
    def scored(self) -> bool:
        """Whether points may be written for this outcome. `not_run` and `environment_error` say
        the grading machine decided it (no GPU, a module it lacks, a GPU that failed its health
        check): no grade, never a 0 (grader/report/exports.py asks this)."""
        return self not in (Status.NOT_RUN, Status.ENVIRONMENT_ERROR, Status.NO_RESULT)

    @property
    def description(self) -> str:
        """What the status means, in a sentence a student reads."""
        return _DESCRIPTIONS[self]


_DESCRIPTIONS = {
    Status.BUILD_ERROR: "did not compile (CUDA) or import (Python)",
    Status.RUNTIME_ERROR: "raised, crashed, or returned something unusable",
    Status.TIMEOUT: "a stage ran past its time limit",
    Status.MISMATCH: "ran, but an output is outside the tolerance",
    Status.FLAGGED: "caught doing something other than the assignment",
    Status.REVIEW: ("passed its cases, but uses code the grader cannot account for: not ranked "
                    "until an instructor has looked at it (this is not a cheating verdict)"),
    Status.NOT_RUN: "not run: the grading machine lacks the hardware (no CUDA device); no grade",
    Status.ENVIRONMENT_ERROR: ("the grading machine failed (a module it should have, or its GPU), "
                               "not your submission: it is not your fault and it is not graded; "
                               "the instructor will fix the machine and grade it again"),
    Status.NO_RESULT: ("no result yet: the grading run did not finish this submission (interrupted, "
                       "or its result file was lost); it is not graded until it is graded again"),
    Status.PASS: "every case that was run is within the tolerance",
}

# Worst first: when several cases fail differently, the submission's status is the worst one. A
# failure of the machine outranks the submission's own: its other verdicts may be its effects.
SEVERITY = [Status.FLAGGED, Status.ENVIRONMENT_ERROR, Status.BUILD_ERROR, Status.TIMEOUT,
            Status.RUNTIME_ERROR, Status.MISMATCH, Status.REVIEW, Status.NO_RESULT, Status.NOT_RUN,
            Status.PASS]


def worst(statuses) -> Status:
    statuses = list(statuses)
    return min(statuses, key=SEVERITY.index) if statuses else Status.NOT_RUN

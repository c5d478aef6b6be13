"""The one status vocabulary, used by the JSON results, the HTML page and the CSV."""

from __future__ import annotations

import enum


class Status(str, enum.Enum):
    BUILD_ERROR = "build_error"      # did not compile (CUDA) or import (Python)
    RUNTIME_ERROR = "runtime_error"  # raised, crashed, or returned something unusable
    TIMEOUT = "timeout"              # a stage ran past its wall-clock limit
    MISMATCH = "mismatch"            # ran, but an output is outside the tolerance
    FLAGGED = "flagged"              # caught doing something other than the assignment
    NOT_RUN = "not_run"              # needed hardware this machine lacks (no CUDA device)
    PASS = "pass"                    # every case that was run is within the tolerance

    def __str__(self) -> str:
        return self.value


# Worst first: when several cases fail differently, the submission's status is the worst one.
SEVERITY = [Status.FLAGGED, Status.BUILD_ERROR, Status.TIMEOUT, Status.RUNTIME_ERROR,
            Status.MISMATCH, Status.NOT_RUN, Status.PASS]


def worst(statuses) -> Status:
    statuses = list(statuses)
    return min(statuses, key=SEVERITY.index) if statuses else Status.NOT_RUN

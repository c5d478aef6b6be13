"""The progress display: the time left, and a count of each status at the end."""

from __future__ import annotations

import io

from grader.progress import Progress, clock, eta_seconds
from grader.status import Status

from .test_results import sample


def test_eta_is_the_mean_pace_times_what_is_left():
    assert eta_seconds(0, 10, 5.0) is None
    assert eta_seconds(2, 10, 30.0) == 120.0
    assert eta_seconds(10, 10, 99.0) == 0.0
    assert [clock(s) for s in (7, 185, 3720)] == ["7s", "3m05s", "1h02m"]


def test_plain_lines_carry_the_eta_and_the_close_counts_statuses():
    stream = io.StringIO()
    progress = Progress(3, live=False, stream=stream)
    progress.done(sample("a", Status.PASS))
    progress.done(sample("b"))
    progress.done(sample("c"))
    progress.close()
    lines = stream.getvalue().splitlines()
    assert "[1/3, about" in lines[0] and "left]" in lines[0]
    assert lines[2].endswith("[3/3, about 0s left]")
    assert lines[-1].startswith("graded 3 of 3 in ") and lines[-1].endswith(": 2 mismatch · 1 pass")

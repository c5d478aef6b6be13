"""The progress display: the time left, and a count of each status at the end."""

from __future__ import annotations

import io

from grader.report.progress import Progress, clock, eta_seconds
from grader.common.status import Status

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


def test_skips_and_misses_are_counted_and_an_interruption_said():
    stream = io.StringIO()
    progress = Progress(5, live=False, stream=stream)
    progress.skipped(sample("a", Status.PASS), "a")
    progress.skipped(None, "b", kept=True)
    progress.skipped(sample("c"), "c", kept=True)
    progress.done(sample("d"))
    progress.close(interrupted=True, missing=2)
    lines = [line.split("] ", 1)[-1] if line.startswith("[") else line
             for line in stream.getvalue().splitlines()]   # without the timestamps
    assert lines[0] == "a: unchanged since 2026-11-21T00:00:00+00:00, skipped: pass [1/5]"
    assert lines[1] == "b: not in --only and no result: shown as missing"
    assert "[4/5, about" in lines[2]   # the time left at the pace of what was graded
    assert lines[-1].startswith("graded 1 of 5 in ")
    assert lines[-1].endswith(", skipped 1 unchanged, kept 2 (not in --only), 2 missing results, "
                              "interrupted: 1 of 2 graded: 2 mismatch · 1 pass")


def test_a_verdict_that_lists_its_reasons_shows_the_first_on_the_console():
    # Session 8 on the GPU: "flagged - reaches past its kernel: ... Remove them: (123.7s)" named
    # nothing; the line after the colon is the reason.
    import dataclasses
    stream = io.StringIO()
    progress = Progress(1, live=False, stream=stream)
    flagged = dataclasses.replace(sample("a", Status.FLAGGED), message=(
        "reaches past its kernel: ... Remove them:\n  cuda.cuda.o: cudaGetDriverEntryPointByVersion "
        "(loads or looks up code behind the grader's back)\n  cuda.cuda.o: dlsym (...)"))
    progress.done(flagged)
    line = stream.getvalue().splitlines()[0]
    assert "Remove them: cuda.cuda.o: cudaGetDriverEntryPointByVersion (loads" in line
    assert "dlsym" not in line

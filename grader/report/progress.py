"""Progress: a live rich display in a terminal, plain timestamped lines in a CI log; both with
an estimate of the time left, and a count of each status at the end."""

from __future__ import annotations

import collections
import sys
import threading
import time
from typing import TYPE_CHECKING

from grader.common.text import headline
from grader.report.feedback import status_label

if TYPE_CHECKING:
    from grader.course.results import SubmissionResult


def eta_seconds(finished: int, total: int, elapsed_s: float) -> float | None:
    """Time left at the mean pace so far; None before the first result."""
    if finished <= 0 or finished >= total:
        return None if finished <= 0 else 0.0
    return elapsed_s / finished * (total - finished)


def clock(seconds: float) -> str:
    """12s, 3m05s, 1h02m."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def status_totals(counts: collections.Counter) -> str:
    """'5 pass · 2 mismatch · 1 build_error', most common first."""
    return " · ".join(f"{n} {status}" for status, n in counts.most_common()) or "nothing graded"


class Progress:
    """Shows which submission is in which stage, each verdict as it lands, the time left, and
    the count of each status when it closes."""

    def __init__(self, total: int, *, live: bool | None = None, stream=None):
        self.total, self.finished = total, 0      # finished: graded + skipped + kept
        self._lock = threading.RLock()            # GPU workers report from their own threads
        self.graded = self.unchanged = self.kept = self.missing = 0
        self.counts: collections.Counter = collections.Counter()
        self.stream = stream or sys.stderr
        self.t0 = time.monotonic()
        self.live = self.stream.isatty() if live is None else live
        self._rich = None
        if self.live:
            try:
                from rich.console import Console
                from rich.progress import (BarColumn, MofNCompleteColumn, TextColumn,
                                           TimeElapsedColumn, TimeRemainingColumn)
                from rich.progress import Progress as RichProgress
                self._rich = RichProgress(TextColumn("[bold]grading"), BarColumn(),
                                          MofNCompleteColumn(), TimeElapsedColumn(),
                                          TextColumn("left"), TimeRemainingColumn(),
                                          TextColumn("{task.description}"),
                                          console=Console(file=self.stream), transient=True)
                self._task = self._rich.add_task("", total=total)
                self._rich.start()
            except ImportError:
                self._rich = None

    def _line(self, text: str) -> None:
        with self._lock:
            if self._rich is not None:
                self._rich.console.print(text, markup=False, highlight=False)
            else:
                print(f"[{time.monotonic() - self.t0:7.1f}s] {text}", file=self.stream, flush=True)

    @property
    def in_place(self) -> bool:
        """Whether stage() updates the live display's line in place (a terminal with rich) rather
        than printing a line: a caller may then report a stage's progress often."""
        return self._rich is not None

    def set_total(self, total: int) -> None:
        """The run's entries, once planned (a run on several GPUs times each baseline on each)."""
        with self._lock:
            self.total = total
            if self._rich is not None:
                self._rich.update(self._task, total=total)

    def on(self, where: str) -> "OnGpu":
        """This display as one GPU worker reports to it: its stages, notes and verdicts say
        where ('GPU 1 (NVIDIA H200)')."""
        return OnGpu(self, where)

    def eta(self) -> str:
        """At the pace of what was graded (a skip takes no time)."""
        left = eta_seconds(self.graded, self.graded + self.total - self.finished,
                           time.monotonic() - self.t0)
        return "" if left is None else f"about {clock(left)} left"

    def stage(self, sub_id: str, stage: str) -> None:
        if self._rich is not None:
            self._rich.update(self._task, description=f"{sub_id}: {stage}")
        else:
            self._line(f"{sub_id}: {stage}")

    def done(self, result: "SubmissionResult", where: str = "") -> None:
        with self._lock:
            self.finished += 1
            self.graded += 1
            label = status_label(result).lower()   # cpu-pass: its cases ran on the CPU
            self.counts[label] += 1
            verdict = headline(result.message)
            eta = self.eta()
            self._line(f"{result.label}: {label} - {verdict} ({result.wall_s:.1f}s)"
                       f"{' on ' + where if where else ''}"
                       f" [{self.finished}/{self.total}{', ' + eta if eta else ''}]")
            if self._rich is not None:
                self._rich.update(self._task, advance=1)

    def skipped(self, result: "SubmissionResult | None", sub_id: str, *, kept: bool = False) -> None:
        """Not graded in this run: unchanged since `result` (a line each), or `kept` because
        --only named others (counted; a line only when it has no result, which shows as missing)."""
        with self._lock:
            self._skipped(result, sub_id, kept)

    def _skipped(self, result, sub_id: str, kept: bool) -> None:
        self.finished += 1
        if kept:
            self.kept += 1
            if result is None:
                self.missing += 1
                self._line(f"{sub_id}: not in --only and no result: shown as missing")
        else:
            self.unchanged += 1
            self._line(f"{result.label}: unchanged since {result.graded_at or 'its last grading'}, "
                       f"skipped: {status_label(result).lower()} [{self.finished}/{self.total}]")
        if result is not None:
            self.counts[status_label(result).lower()] += 1
        if self._rich is not None:
            self._rich.update(self._task, advance=1)

    def note(self, text: str) -> None:
        self._line(text)

    def summary(self, *, interrupted: bool = False, missing: int | None = None) -> str:
        """'graded 280 of 298 in 3m05s, skipped 15 unchanged, 3 missing results: 250 pass · …';
        the statuses count every result of the run, skipped ones too."""
        missing = self.missing if missing is None else missing
        parts = [f"graded {self.graded} of {self.total} in {clock(time.monotonic() - self.t0)}"]
        if self.unchanged:
            parts.append(f"skipped {self.unchanged} unchanged")
        if self.kept:
            parts.append(f"kept {self.kept} (not in --only)")
        if missing:
            parts.append(f"{missing} missing result{'s' if missing != 1 else ''}")
        if interrupted:
            parts.append(f"interrupted: {self.graded} of {self.total - self.finished + self.graded} "
                         f"graded")
        return ", ".join(parts) + f": {status_totals(self.counts)}"

    def close(self, *, interrupted: bool = False, missing: int | None = None) -> None:
        if self._rich is not None:
            self._rich.stop()
            self._rich = None
        if self.finished or interrupted:
            print(self.summary(interrupted=interrupted, missing=missing), file=self.stream,
                  flush=True)


class OnGpu:
    """A Progress as one GPU worker of several reports to it: each stage, note and verdict
    names the GPU."""

    def __init__(self, progress: Progress, where: str):
        self.progress, self.where = progress, where

    def stage(self, sub_id: str, stage: str) -> None:
        self.progress.stage(sub_id, f"{stage} on {self.where}")

    def note(self, text: str) -> None:
        self.progress.note(f"{self.where}: {text}")

    def done(self, result: "SubmissionResult", where: str = "") -> None:
        self.progress.done(result, where or self.where)

    def __getattr__(self, name):
        return getattr(self.progress, name)

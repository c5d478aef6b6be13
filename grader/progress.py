"""Progress: a live rich display in a terminal, plain timestamped lines in a CI log."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .results import SubmissionResult


class Progress:
    """Shows which submission is in which stage, and each verdict as it lands."""

    def __init__(self, total: int, *, live: bool | None = None, stream=None):
        self.total, self.finished = total, 0
        self.stream = stream or sys.stderr
        self.t0 = time.monotonic()
        self.live = self.stream.isatty() if live is None else live
        self._rich = None
        if self.live:
            try:
                from rich.console import Console
                from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
                from rich.progress import Progress as RichProgress
                self._rich = RichProgress(TextColumn("[bold]grading"), BarColumn(),
                                          MofNCompleteColumn(), TimeElapsedColumn(),
                                          TextColumn("{task.description}"),
                                          console=Console(file=self.stream), transient=True)
                self._task = self._rich.add_task("", total=total)
                self._rich.start()
            except ImportError:
                self._rich = None

    def _line(self, text: str) -> None:
        if self._rich is not None:
            self._rich.console.print(text, markup=False, highlight=False)
        else:
            print(f"[{time.monotonic() - self.t0:7.1f}s] {text}", file=self.stream, flush=True)

    def stage(self, sub_id: str, stage: str) -> None:
        if self._rich is not None:
            self._rich.update(self._task, description=f"{sub_id}: {stage}")
        else:
            self._line(f"{sub_id}: {stage}")

    def done(self, result: "SubmissionResult") -> None:
        self.finished += 1
        self._line(f"{result.label}: {result.status.value} - {result.message.splitlines()[0] if result.message else ''}"
                   f" ({result.wall_s:.1f}s)")
        if self._rich is not None:
            self._rich.update(self._task, advance=1)

    def note(self, text: str) -> None:
        self._line(text)

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()

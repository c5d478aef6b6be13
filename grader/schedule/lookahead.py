"""Runs begun early (issue 13): a GPU worker's lane prepares its next submissions' harnesses and
subjects while the one before runs (Lookahead), and keeps a spare harness started (keep_warm).
The stages see it only as their thread's EarlyRuns (grader/stages/turns.py).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
from collections import deque

from grader.common.status import Status
from grader.course.submission import Submission
from grader.course.verdicts import BuildResult
from grader.isolation.procs import Cancelled
from grader.problem import Case, largest
from grader.schedule.gate import GpuGate
from grader.schedule.jobs import Jobs
from grader.stages.ahead import EarlyRuns, early, forget_early, install_early
from grader.stages.context import GradeContext
from grader.stages.early import prepare
from grader.stages.harnesses import Prepared, drop_spares, keep_spares


@contextlib.contextmanager
def keep_warm():
    """Inside, the calling thread (a GPU worker) keeps a spare harness started (take_harness);
    it is closed on the way out."""
    keep_spares()
    install_early(Lookahead())
    try:
        yield
    finally:
        early().drop()
        forget_early()
        drop_spares()


def take_ahead(jobs: Jobs, slot: int, ahead: deque, lookahead: int) -> None:
    """Up to `lookahead` of GPU `slot`'s next jobs into `ahead`, as many as are ready now."""
    while len(ahead) < lookahead:
        upcoming = jobs.take(slot, wait=False)
        if upcoming is None:
            return
        ahead.append(upcoming)


def first_turn(jobs: Jobs, slot: int, job, ahead: deque, worker: GradeContext,
               calibrated: concurrent.futures.Future) -> GradeContext:
    """A lane's first job (a baseline, or the first build): while the worker's GPU is still
    being calibrated (workers.CourseRun.calibrating), its run and the next ones' are begun as
    their builds end (harnesses and subjects starting CUDA, as they do beside every timed call of
    the course), so that the first turns do not start their processes after the calibration.
    Then the lane's context with the calibrated cost, which each prepared run's time stage is
    told on its turn (harnesses.turn_word): every GPU stage waits for it."""
    timed = largest(list(worker.cases)) if worker.device.cuda else None
    seen = -1
    while not calibrated.done():
        take_ahead(jobs, slot, ahead, worker.lookahead)
        if len(ahead) != seen:   # begun once each: one whose preparation failed is not tried again
            seen = len(ahead)
            early().queue([job, *ahead])
            early().begin(worker, timed)
        concurrent.futures.wait([calibrated], timeout=0.25)
    return dataclasses.replace(worker, protocol=calibrated.result())


class Lookahead(EarlyRuns):
    """A GPU worker's next submissions, begun while the one before runs (issue 13). The worker
    says which come next (queue); when a run stage starts, up to config.LOOKAHEAD of them are
    being prepared (begin): a harness and a subject each, with torch's import, CUDA's start, the
    shared buffers and the profiler's first start (10-15 s on an H100), on the builds' CPUs, off
    the GPU's critical path. Only the grader's code and torch run in them until their turn: a
    submission is loaded when its run stage says "run", and its processes move to the GPU
    stages' CPUs then. They may start CUDA while another submission's call is timed: that moved
    no timed call (bench/prepare_overlap_probe.json: medians within 0.3%). A turn claims its run
    (grade_submission), waiting for its preparation to end; what is not claimed is closed with
    the worker. One per GPU worker (_AHEAD: PerThread)."""

    def __init__(self):
        self.queued: list[tuple[Submission, BuildResult]] = []   # to begin, in order
        self.prepared: list[Prepared] = []                       # begun, in order

    def queue(self, jobs: list) -> None:
        """The worker's next jobs, in order: the submissions' whose build passed may be begun."""
        begun = {id(p.sub) for p in self.prepared}
        self.queued = [(sub, build) for what, _, sub, build in jobs
                       if what == "submission" and build.status is Status.PASS
                       and id(sub) not in begun]

    def begin(self, ctx: GradeContext, timed: Case | None) -> None:
        while timed is not None and self.queued and len(self.prepared) < ctx.lookahead:
            sub, build = self.queued.pop(0)
            try:
                prepared = prepare(sub, build, ctx, timed)
            except Cancelled:
                raise
            except Exception as e:   # never the running submission's problem: it runs as usual
                ctx.progress.note(f"{sub.id}: could not begin its run early ({e!r})")
                continue
            if prepared is not None:
                self.prepared.append(prepared)

    def settle(self) -> None:
        for prepared in self.prepared:
            prepared.settle()

    def begun(self, sub: Submission) -> bool:
        """Whether this worker began a run of `sub` early (its turn then waits for it: claim)."""
        return any(p.sub is sub for p in self.prepared)

    def claim(self, sub: Submission, gate: GpuGate | None = None) -> Prepared | None:
        """The prepared run of `sub`, once its preparation has ended, if this worker began one
        and it got ready, and no health check of its GPU began since it was begun (`gate`, where
        lanes share the GPU: another lane's crash); else None. Runs begun for submissions queued
        before it are closed (their turn is past); those after it stay."""
        for i, got in enumerate(self.prepared):
            if got.sub is sub:
                skipped, self.prepared = self.prepared[:i], self.prepared[i + 1:]
                for other in skipped:
                    other.close()
                fresh = gate is None or gate.health_checks == got.health_checks
                if fresh and got.settle() and got.stages.harness.proc.poll() is None:
                    return got
                got.close()
                return None
        return None

    def drop(self) -> None:
        self.queued = []
        begun, self.prepared = self.prepared, []
        for got in begun:
            got.close()

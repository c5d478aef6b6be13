"""Who may use one GPU when run stages share it (issue 13, config.GPU_LANES).

The invariant it keeps: **while a call is timed on a GPU, no other submission's code runs on
that machine's view of the GPU**, and no trusted work of the grader's but the timed call's own
harness does GPU work there beyond what a preparation does (CUDA's start, buffers, the
profiler's first start: bench/prepare_overlap_probe.json measured them beside timed calls).

- Run and check stages hold the gate *shared*, any number at once: the submissions' JIT
  compiles and cases overlap, and nothing of them is timed.
- A time stage (and the calibration, a baseline) holds it *alone*: it waits until every shared
  holder has let go, and a shared holder lets go only once its subject's processes have exited
  (run.let_go). While a time stage waits, no new shared holder starts, so a time stage
  waits at most for the run stages already under way.
- Each submission is timed on a fresh subject (harnesses.TimeSubject): its run stage's subject,
  which other submissions' code ran beside, is killed before the gate is let go.

The gate is the grader's own object in its own process: no submission process can see or
change it. Waits give up with Cancelled when the run stops.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from grader.isolation.procs import Cancelled, stopping
from grader.stages.turns import Company


class GpuGate:
    """One GPU's gate: shared holds (run and check stages) or one alone (a time stage), never
    both; a waiting alone goes before new shared holds."""

    def __init__(self):
        self._cond = threading.Condition()
        self._holders: set[Company] = set()
        self._alone = False
        self._waiting = 0   # alone holds waiting: no new shared hold starts meanwhile
        self.health_checks = 0   # GPU health checks begun or ended (health.ensure_gpu_healthy)

    def health_check(self) -> None:
        """A health check of this GPU begins or has ended: every preparation (harnesses.Prepared),
        any lane's, begun before now started CUDA beside a crash or a hung kernel, or before the GPU
        was found healthy, and is not used (Lookahead.claim)."""
        with self._cond:
            self.health_checks += 1

    @contextlib.contextmanager
    def shared(self) -> Iterator[Company]:
        company = Company()
        with self._cond:
            self._wait(lambda: not self._alone and not self._waiting)
            for other in self._holders:
                other.crowded = True
            company.crowded = bool(self._holders)
            self._holders.add(company)
        try:
            yield company
        finally:
            with self._cond:
                self._holders.discard(company)
                self._cond.notify_all()

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            try:
                self._wait(lambda: not self._alone and not self._holders)
            finally:
                self._waiting -= 1
            self._alone = True
        try:
            yield
        finally:
            with self._cond:
                self._alone = False
                self._cond.notify_all()

    @property
    def held_alone(self) -> bool:
        """Whether a time stage (or another alone hold) has the GPU now."""
        return self._alone

    def _wait(self, ready) -> None:
        while not ready():
            if stopping():
                self._cond.notify_all()
                raise Cancelled("the run is stopping")
            self._cond.wait(timeout=0.5)


class BuildThrottle:
    """Builds yield to GPU stages that have work (issue 13). While at least `ahead` built
    submissions wait for the GPU workers (`waiting()`), at most `low` builds compile at once;
    otherwise up to `high` (the pool's size). Builds slow the GPU stages though these have CPUs
    of their own (shared caches, memory bandwidth): a Triton copy's run stage took 5.2 s beside
    13 builds and 4.1 s beside 6 (Limits.build_yield_share says where it was measured). With a
    queue that long the GPU has minutes of work, and fewer builds still finish before it runs
    out; when it runs short, they go back up to `high`.

    A build waits for its turn here before it starts, never in the middle; the limit is looked
    at again every `poll_s` (the queue shrinks as the workers take jobs). Waits give up with
    Cancelled when the run stops."""

    def __init__(self, high: int, low: int, ahead: int, waiting, poll_s: float = 0.5):
        self.high, self.low, self.ahead = max(1, high), max(1, min(low, high)), ahead
        self.waiting, self.poll_s = waiting, poll_s
        self.running = 0
        self.most = 0   # the most builds that compiled at once (tests, the bench)
        self.cond = threading.Condition()

    def limit(self) -> int:
        return self.low if self.waiting() >= self.ahead else self.high

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        with self.cond:
            while self.running >= self.limit():
                if stopping():
                    raise Cancelled("the run is stopping: a build waiting for its turn")
                self.cond.wait(self.poll_s)
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            yield
        finally:
            with self.cond:
                self.running -= 1
                self.cond.notify_all()

"""What a grading run's GPU workers take (Jobs): jobs pinned to a worker, then the shared queue of
finished builds (grader/schedule/workers.py fills it)."""

from __future__ import annotations

import threading
from collections import deque


class Jobs:
    """What the GPU workers take, in order: jobs pinned to a worker (a baseline timed on its GPU)
    first, then the shared queue (students' finished builds: a faster GPU takes more). `pending`
    counts the builds not finished yet; a worker with nothing to take waits for them, and stops
    when there are none left, or when the run stops."""

    def __init__(self, workers: int):
        self.cond = threading.Condition()
        self.pinned = [deque() for _ in range(workers)]
        self.shared: deque = deque()
        self.pending = 0
        self.stopped = False
        self.idle = 0   # workers waiting for a job

    def put(self, jobs: list, *, built: bool = False) -> None:
        """Queue (slot or None, job) pairs; `built`: a pending build's jobs (or none, if it went)."""
        with self.cond:
            for slot, job in jobs:
                (self.shared if slot is None else self.pinned[slot]).append(job)
            self.pending -= 1 if built else 0
            self.cond.notify_all()

    def take(self, slot: int, *, wait: bool = True):
        """The next job for worker `slot`; None when there is none. Without `wait` (a worker
        taking its next job early, Lookahead): one now, and a shared one only if a job is left
        for every worker waiting for one: a GPU never idles while another holds a job."""
        with self.cond:
            while True:
                if self.stopped:
                    return None
                if self.pinned[slot]:
                    return self.pinned[slot].popleft()
                if self.shared and (wait or len(self.shared) > self.idle):
                    return self.shared.popleft()
                if self.pending <= 0 or not wait:
                    return None
                self.idle += 1
                try:
                    self.cond.wait()
                finally:
                    self.idle -= 1

    def waiting(self) -> int:
        """Jobs queued and not taken yet."""
        with self.cond:
            return len(self.shared) + sum(len(q) for q in self.pinned)

    def stop(self) -> list:
        """No worker takes anything more; returns what was still queued."""
        with self.cond:
            self.stopped = True
            left = [job for q in (*self.pinned, self.shared) for job in q]
            for q in (*self.pinned, self.shared):
                q.clear()
            self.cond.notify_all()
            return left

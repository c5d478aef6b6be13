"""A GPU's turns, as the stages ask for them: shared with other run stages, or alone.

The stages never import grader.schedule. They say when they need their GPU shared or alone
(alone, shared), through the context's `Gate`: a GpuGate (grader/schedule/gate.py) where lanes
share a GPU, else None and nothing to wait for. PerThread holds one object per thread (the runs
begun early, ahead.py; a lane's spare harness, harnesses.py).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Protocol


class Gate(Protocol):
    """Who may use one GPU when run stages share it (grader/schedule/gate.py's GpuGate)."""
    health_checks: int

    def shared(self) -> contextlib.AbstractContextManager[Company]: ...
    def alone(self) -> contextlib.AbstractContextManager[None]: ...
    def health_check(self) -> None: ...


class Company:
    """One shared hold: whether any other holder, shared, held the gate at some time during it
    (crowded). A run stage that failed in company is run again alone before it counts: another
    submission beside it could have used up the GPU's memory or time."""

    def __init__(self):
        self.crowded = False


@contextlib.contextmanager
def alone(gate: Gate | None) -> Iterator[None]:
    """gate.alone(), or nothing where runs do not share the GPU (no gate)."""
    if gate is None:
        yield
    else:
        with gate.alone():
            yield


@contextlib.contextmanager
def shared(gate: Gate | None) -> Iterator[Company]:
    """gate.shared(), or a Company never crowded where runs do not share the GPU."""
    if gate is None:
        yield Company()
    else:
        with gate.shared() as company:
            yield company


class PerThread:
    """One object per thread, made on first use, held in a plain dict keyed by the thread rather
    than in threading.local, for whatever holds processes or folders (_AHEAD, _SPARE).
    procs.spawn_capped starts every child with a preexec_fn, so Python runs in the child after
    fork, and there the other threads' thread-local data is freed: what
    only it holds is deallocated and its finalizers run, in the child but on the shared disk. A
    GPU worker's runs begun early, held in a threading.local, lost their folders that way
    (TemporaryDirectory's finalizer removed them) whenever a build thread started a process:
    6 of 9 in session 14's course, each then a grader error. Attributes are the calling thread's
    object's, to read and to set; forget() lets the calling thread's go (at the worker's end)."""

    def __init__(self, make):
        self._make, self._objects, self._lock = make, {}, threading.Lock()

    def mine(self):
        with self._lock:
            key = threading.get_ident()
            if key not in self._objects:
                self._objects[key] = self._make()
            return self._objects[key]

    def install(self, obj) -> None:
        """The calling thread's object is `obj` from now."""
        with self._lock:
            self._objects[threading.get_ident()] = obj

    def forget(self) -> None:
        with self._lock:
            self._objects.pop(threading.get_ident(), None)

    def __getattr__(self, name: str):
        return getattr(self.mine(), name)

    def __setattr__(self, name: str, value) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self.mine(), name, value)

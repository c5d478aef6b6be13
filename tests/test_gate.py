"""grader/gate.py: who may use one GPU when run stages share it (issue 13, grade --lanes)."""

from __future__ import annotations

import threading
import time

import pytest

from grader import procs
from grader.gate import GpuGate


def _hold(gate: GpuGate, how: str, log: list, seconds: float, entered: threading.Event | None = None):
    with (gate.shared() if how == "shared" else gate.alone()):
        log.append((how, "in", time.monotonic()))
        if entered is not None:
            entered.set()
        time.sleep(seconds)
        log.append((how, "out", time.monotonic()))


def test_shared_holds_overlap_and_an_alone_hold_has_the_gpu_to_itself():
    """Run stages (shared) run together; a time stage (alone) begins only once every run stage
    under way has let go, and no run stage begins while it holds the gate or waits for it."""
    gate, log = GpuGate(), []
    first = threading.Event()
    runs = [threading.Thread(target=_hold, args=(gate, "shared", log, 0.6, first if i == 0 else None))
            for i in range(2)]
    for t in runs:
        t.start()
    first.wait(10)
    time.sleep(0.1)
    timed = threading.Thread(target=_hold, args=(gate, "alone", log, 0.5))
    timed.start()
    time.sleep(0.1)   # the time stage waits; a run stage asking now waits behind it
    late = threading.Thread(target=_hold, args=(gate, "shared", log, 0.1))
    late.start()
    for t in (*runs, timed, late):
        t.join(10)
    order = [(how, what) for how, what, _ in log]
    assert order[:2] == [("shared", "in"), ("shared", "in")]          # together
    assert order[2:4] == [("shared", "out"), ("shared", "out")]
    assert order[4:] == [("alone", "in"), ("alone", "out"), ("shared", "in"), ("shared", "out")]
    alone_in = next(t for how, what, t in log if (how, what) == ("alone", "in"))
    assert alone_in >= max(t for how, what, t in log if what == "out" and how == "shared" and t < alone_in)


def test_a_shared_hold_knows_whether_another_shared_it_at_any_time():
    """Company.crowded: a run stage that had company at any moment of its hold, even company that
    came after it began, may fail because of it (and is run again alone: pipeline)."""
    gate = GpuGate()
    with gate.shared() as first:
        assert not first.crowded
        with gate.shared() as second:
            assert second.crowded
        assert first.crowded
    with gate.shared() as alone_run:
        pass
    assert not alone_run.crowded


def test_a_wait_for_the_gate_ends_when_the_run_stops():
    """A lane waiting for the gate while the run stops (Ctrl-C: procs.cancel_all) gives up with
    Cancelled instead of waiting for holders that will never come back."""
    gate, raised = GpuGate(), []

    def wait_alone():
        try:
            with gate.alone():
                pass
        except procs.Cancelled as e:
            raised.append(e)

    with gate.shared():
        waiter = threading.Thread(target=wait_alone)
        waiter.start()
        time.sleep(0.2)
        procs.CHILDREN.cancelled.set()
        try:
            waiter.join(10)
        finally:
            procs.CHILDREN.cancelled.clear()
    assert not waiter.is_alive() and len(raised) == 1


@pytest.mark.parametrize("first", ["alone", "shared"])
def test_an_exception_inside_a_hold_lets_the_gate_go(first):
    gate = GpuGate()
    with pytest.raises(RuntimeError):
        with (gate.alone() if first == "alone" else gate.shared()):
            raise RuntimeError("a grader bug")
    done = []
    t = threading.Thread(target=lambda: _hold(gate, "alone", done, 0.0))
    t.start()
    t.join(5)
    assert [what for _, what, _ in done] == ["in", "out"]

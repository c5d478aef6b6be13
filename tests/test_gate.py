"""grader/schedule/gate.py: who may use one GPU when run stages share it (issue 13, grade --lanes)."""

from __future__ import annotations

import threading
import time

import pytest

from grader.isolation import procs
from grader.schedule.gate import BuildThrottle, GpuGate


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


def _builds(throttle: BuildThrottle, n: int, seconds: float, raised: list | None = None) -> list:
    def build():
        try:
            with throttle.turn():
                time.sleep(seconds)
        except procs.Cancelled as e:
            if raised is not None:
                raised.append(e)
    threads = [threading.Thread(target=build) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


def test_builds_yield_to_a_gpu_with_work_queued_and_come_back_when_it_runs_short():
    """Issue 13: while BUILDS_YIELD_AHEAD built submissions wait for the GPU workers, fewer builds
    compile at once (they slowed the GPU stages by a quarter); with the queue short, all of
    them again. A build waits for its turn before it starts."""
    queued = [10]
    throttle = BuildThrottle(high=4, low=2, ahead=10, waiting=lambda: queued[0], poll_s=0.05)
    for t in _builds(throttle, 6, 0.3):
        t.join(10)
    assert throttle.most == 2 and throttle.running == 0

    queued[0] = 9   # the GPU is about to run out of work
    throttle = BuildThrottle(high=4, low=2, ahead=10, waiting=lambda: queued[0], poll_s=0.05)
    for t in _builds(throttle, 6, 0.3):
        t.join(10)
    assert throttle.most == 4

    queued[0] = 50   # two compile; the queue then runs short while others wait their turn
    throttle = BuildThrottle(high=4, low=2, ahead=10, waiting=lambda: queued[0], poll_s=0.05)
    threads = _builds(throttle, 6, 0.6)
    time.sleep(0.2)
    assert throttle.running == 2
    queued[0] = 0
    time.sleep(0.3)
    assert throttle.running == 4   # the waiting ones started without waiting for the first two
    for t in threads:
        t.join(10)


def test_a_build_waiting_for_its_turn_gives_up_when_the_run_stops():
    throttle, raised = BuildThrottle(high=2, low=1, ahead=1, waiting=lambda: 5, poll_s=0.05), []
    threads = _builds(throttle, 3, 1.0, raised)
    time.sleep(0.2)
    procs.CHILDREN.cancelled.set()
    try:
        for t in threads:
            t.join(10)
    finally:
        procs.CHILDREN.cancelled.clear()
    assert len(raised) == 2 and throttle.running == 0 and throttle.most == 1


def test_builds_yield_only_on_a_gpu_machine_and_by_the_limits_share():
    """scheduling.build_throttle: half the build jobs while the GPU stages have work queued, on a
    GPU machine (Limits.build_yield_share, GRADER_BUILD_YIELD_SHARE=1 turns it off); without a
    GPU nothing is timed, and every build job compiles."""
    import types

    from grader.common import config
    from grader.schedule.workers import build_throttle

    def ctx(cuda: bool, share: float = 0.5):
        return types.SimpleNamespace(device=types.SimpleNamespace(cuda=cuda),
                                     limits=config.Limits(build_yield_share=share))
    gpu = build_throttle(13, ctx(True), lambda: config.BUILDS_YIELD_AHEAD)
    assert (gpu.high, gpu.low, gpu.limit()) == (13, 6, 6)
    assert build_throttle(13, ctx(True), lambda: config.BUILDS_YIELD_AHEAD - 1).limit() == 13
    assert build_throttle(13, ctx(False), lambda: 99).limit() == 13
    assert build_throttle(13, ctx(True, share=1.0), lambda: 99).limit() == 13
    assert build_throttle(1, ctx(True), lambda: 99).limit() == 1


def test_a_turn_counts_as_wait_only_the_time_a_gate_was_waited_for():
    """stage_s "wait" (clock.held) is the time a submission waited for its GPU's gate. Where
    runs do not share a GPU there is no gate and no wait, however slow the machine is to get
    there (CI's loaded 2-core machine once took over a millisecond to enter a hold of nothing)."""
    import contextlib

    from grader.stages.turns import alone
    from grader.stages.clock import StageClock, held as held_turn

    @contextlib.contextmanager
    def slow_nothing(gate):   # a descheduled thread: time passes, though there is nothing to wait for
        time.sleep(0.05)
        yield

    clock = StageClock(0.0)
    with held_turn(slow_nothing, None, clock):
        pass
    assert "wait" not in dict(clock.seconds())

    gate, clock = GpuGate(), StageClock(0.0)
    held = threading.Event()

    def hold_a_while():
        with gate.alone():
            held.set()
            time.sleep(0.3)

    other = threading.Thread(target=hold_a_while)
    other.start()
    held.wait(10)
    with held_turn(alone, gate, clock):
        pass
    other.join(10)
    assert dict(clock.seconds())["wait"] >= 0.2

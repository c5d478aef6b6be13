"""One timed call's order (grader/trusted/timed_calls.Call.run): the GPU's idle before a call
(Limits.timing_idle_ms) comes before the call's inputs reach the buffers the subject reads, so a
subject watching them has no idle GPU to compute on before "go"."""

from __future__ import annotations

import time

import pytest
import torch

from grader.common import config
from grader.problem import make_random_inputs
from grader.trusted import timed_calls
from grader.trusted.timed_calls import Call

SHAPE = (1, 2, 16, 8)


class FakeLink:
    """The harness's side of the pipes, as Call.run uses it: every "go" answered "done"."""

    def __init__(self, events: list):
        self.events, self.n = events, 0

    def send(self, request: dict) -> int:
        self.events.append(("send", request["op"]))
        self.n += 1
        return self.n

    def encode(self, request: dict) -> tuple[int, bytes]:
        self.n += 1
        return self.n, b"go\n"

    def write(self, line: bytes) -> None:
        self.events.append(("go",))

    def receive(self, deadline: float, expect: int | None = None) -> dict:
        return dict(event="done")

    def drain(self) -> None:
        pass

    def expect_diagnostics(self, n: int) -> None:
        pass


def make_call(idle_ms: float, events: list) -> Call:
    q, k, v, o = (torch.zeros(SHAPE, dtype=torch.float16) for _ in range(4))
    flush = torch.ones(64, dtype=torch.uint8)
    return Call(FakeLink(events), q, k, v, o, flush, SHAPE, "cpu", time.monotonic() + 60,
                idle_ms=idle_ms)


def test_idle_comes_before_the_inputs_reach_the_subjects_buffers(monkeypatch):
    events: list = []
    call = make_call(7.0, events)

    def sleep(seconds):
        # what a subject watching its buffers could see during the idle: nothing of this call
        events.append(("idle", seconds, [float(t.abs().sum()) for t in (call.q, call.k, call.v)]))

    monkeypatch.setattr(timed_calls.time, "sleep", sleep)
    _, inputs = call.run(seed=5)
    kinds = [e[0] for e in events]
    assert kinds == ["send", "idle", "go"]
    assert events[1][1] == pytest.approx(0.007)
    assert events[1][2] == [0.0, 0.0, 0.0]
    expected = make_random_inputs(SHAPE, seed=5, device="cpu")
    for buffer, made, want in zip((call.q, call.k, call.v), inputs, expected):
        assert torch.equal(buffer, made) and torch.equal(made, want)
    assert torch.isnan(call.o).all() and not call.flush.any()


def test_no_idle_without_the_knob(monkeypatch):
    events: list = []
    call = make_call(0.0, events)
    monkeypatch.setattr(timed_calls.time, "sleep", lambda s: events.append(("idle", s)))
    call.run(seed=1)
    assert [e[0] for e in events] == ["send", "go"]


def test_the_knob_reaches_a_call_through_its_spec(monkeypatch):
    """The pause is on by default, GRADER_TIMING_IDLE_MS sets it, and open_call makes every call
    with the spec's (stages.time.call_fields puts it in every timed row's and the calibration's)."""
    assert config.Limits().timing_idle_ms > 0
    monkeypatch.setenv("GRADER_TIMING_IDLE_MS", "3.5")
    assert config.Limits.from_env().timing_idle_ms == 3.5
    spec = dict(device="cpu", case=dict(batch_size=1, num_heads=2, seq_len=16, head_dim=8,
                                         seed=1), l2_bytes=0, idle_ms=3.5)
    buffers = {n: FakeBuffer() for n in "qkvo"}
    _, call = timed_calls.open_call(spec, time.monotonic() + 60, (FakeLink([]), buffers))
    assert call.idle_s == pytest.approx(0.0035)


class FakeBuffer:
    def view(self, shape):
        return torch.zeros(shape, dtype=torch.float16)


def test_the_pause_twins_rejected_order_is_made_from_todays_call():
    """bench/pause_twin.py grades the pause's attack twin (peek_inputs_py) with a copy of the
    grader whose Call.run idles after writing the inputs: the edit must still find today's lines,
    and make exactly that swap, or the GPU run that shows the twin is an attack tests nothing."""
    import importlib.util
    path = config.REPO_ROOT / "bench" / "pause_twin.py"
    spec = importlib.util.spec_from_file_location("pause_twin", path)
    twin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(twin)
    source = (config.REPO_ROOT / twin.TIMED_CALLS).read_text()
    rejected = twin.idle_after_inputs(source)
    assert source.index(twin.IDLE) < source.index(twin.COPY)          # as committed: idle first
    assert rejected.index(twin.COPY) < rejected.index(twin.IDLE)      # the copy: inputs first
    assert sorted(rejected.splitlines()) == sorted(source.splitlines())   # nothing else changed
    with pytest.raises(SystemExit, match="no longer has the idle"):
        twin.idle_after_inputs(source.replace(twin.COPY, ""))

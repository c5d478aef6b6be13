"""One timed call and its clocks: Call (fresh inputs, L2 flushed, O poisoned, "go", the reply,
O read back), Clock (the host clock and this process's GPU events), the subject opened for timing
(open_call), its warm-up and round trip; the subject's own figures about each call, and the
per-call times less the protocol's calibrated cost (corrected, coarse_enough)."""

from __future__ import annotations

import os
import statistics
import time
import torch

from grader.common import config
from grader.course.results import LOOP_PARTS
from grader.course.verdicts import ProtocolCost
from grader.problem import Case, make_random_inputs
from grader.protocol.buffers import SharedBuffer
from grader.trusted.link import Link, synchronize
from grader.trusted.replies import SubjectGone, _error_text, malformed
from grader.trusted.timing import relative_standard_error


# Captured before anything else runs in this process (nothing else does: this is the trusted side).
_perf_counter = time.perf_counter
_urandom = os.urandom


class Clock:
    """This process's two clocks for one call: the host clock from "go" to the reply, and its GPU
    events from before "go" to its first GPU work after the reply."""

    def __init__(self, device: str):
        self.device = device
        if device == "cuda":
            self.before = torch.cuda.Event(enable_timing=True)
            self.after = torch.cuda.Event(enable_timing=True)

    def go(self) -> None:
        if self.device == "cuda":
            self.before.record()
        self.t0 = _perf_counter()

    def returned(self) -> None:
        self.t_reply = _perf_counter()
        self.wall_ms = (self.t_reply - self.t0) * 1e3
        if self.device == "cuda":
            self.after.record()

    def fence_ms(self) -> float:
        """After synchronize: the GPU clock's reading (the host clock's without a GPU)."""
        return self.before.elapsed_time(self.after) if self.device == "cuda" else self.wall_ms


def round_trip_ms(link: Link, deadline: float, reps: int = 20) -> float:
    """Median request/reply round trip with the subject (no GPU work)."""
    rtts = []
    for _ in range(reps):
        t0 = _perf_counter()
        link.receive(deadline, expect=link.send(dict(op="ping")))
        rtts.append((_perf_counter() - t0) * 1e3)
    return statistics.median(rtts)


def open_call(spec: dict, deadline: float, opened: tuple[Link, dict[str, SharedBuffer]]
              ) -> tuple[Link, "Call"]:
    """The Call that drives `opened`'s subject on the spec's case: a subject running on buffers
    large enough, that made a run stage's calls first (run_stage.run_stage_calls)."""
    device, case = spec["device"], Case.from_dict(spec["case"])
    link, buffers = opened
    link.spin = device == "cuda"   # from here every reply is a timed or calibrated call's
    q, k, v, o = (buffers[n].view(case.shape) for n in "qkvo")
    flush = torch.empty(max(2 * spec["l2_bytes"], 64 << 20), dtype=torch.uint8, device=device)
    return link, Call(link, q, k, v, o, flush, case.shape, device, deadline, case.qk_std,
                      idle_ms=spec.get("idle_ms", 0.0))


def warm_up(link: Link, call: "Call", deadline: float,
            calls: int = config.TIMING_WARMUP_CALLS, slow_ms: float | None = None) -> int:
    """The warm-up calls before timed ones, the profiler turned on before the last of them (the
    first call under the profiler pays for its start). Timed calls run with it on. A first call
    slower than `slow_ms` is the only warm-up (bounded cost: a slow call is timed on a few calls,
    config.TIMING_SLOW_CALLS); the profiler then starts with the first timed call, which a call
    of seconds does not feel. Returns the number of calls made so far: the first timed call's
    place in Call.reported()."""
    for i in range(calls):
        if i == calls - 1:
            _profile_on(link, call, deadline)
        clock, _ = call.run(seed=int.from_bytes(_urandom(8), "little") >> 1)
        if i < calls - 1 and slow_ms is not None and max(clock.wall_ms, clock.fence_ms()) > slow_ms:
            _profile_on(link, call, deadline)
            break
    return len(call.sent)


def _profile_on(link: Link, call: "Call", deadline: float) -> None:
    call.profiled_from = _perf_counter()   # what the profiler covers starts after this
    link.receive(deadline, expect=link.send(dict(op="profile", on=True)))


def slow_enough(times: list[float], slow_ms: float | None) -> bool:
    """A call so slow (median above `slow_ms`) that config.TIMING_SLOW_CALLS calls place it: its
    rank is far below every fast one's, and more calls would hold the GPU for minutes."""
    return (slow_ms is not None and len(times) >= config.TIMING_SLOW_CALLS
            and statistics.median(times) > slow_ms)


def coarse_enough(times: list[float], coarse_ms: float | None) -> bool:
    """A call far slower than the fast ones (median above `coarse_ms`) is placed once
    TIMING_COARSE_MIN_REPS calls agree to TIMING_COARSE_RSE: that precision does not decide ranks."""
    return (coarse_ms is not None and len(times) >= config.TIMING_COARSE_MIN_REPS
            and statistics.median(times) > coarse_ms
            and relative_standard_error(times) < config.TIMING_COARSE_RSE)


class Call:
    """One timed call: fresh inputs from `seed` (this process keeps its own copy), L2 flushed,
    O poisoned, the device idle (left so for `idle_ms` before the inputs are written); then go,
    the reply, and the clocks."""

    def __init__(self, link: Link, q, k, v, o, flush, shape, device: str, deadline: float,
                 qk_std: float = 1.0, idle_ms: float = 0.0):
        self.link, self.q, self.k, self.v, self.o = link, q, k, v, o
        self.idle_s = idle_ms / 1e3   # the GPU idle before the inputs (Limits.timing_idle_ms)
        self.flush, self.shape, self.device, self.deadline = flush, shape, device, deadline
        self.qk_std = qk_std   # the case's spread of Q and K (cases.Case.qk_std)
        self.sent: list[tuple[int, float, float]] = []   # (request number, go, reply) per call
        self.parts = dict.fromkeys(LOOP_PARTS, 0.0)   # seconds in each part (results.LOOP_PARTS)
        self.profiled_from = _perf_counter()   # when "profile on" was sent (warm_up)

    def run(self, seed: int) -> tuple[Clock, tuple[torch.Tensor, ...]]:
        began = _perf_counter()
        # Armed before this call's inputs exist, so that "arm" tells the subject nothing it could
        # start on: it makes its views of the buffers then, and after "go" reads one short line
        # and launches (grader/subject/loop.py). Nothing is waited for here but the reply to
        # "go": a subject slow to take up "arm" is slow inside the clock.
        self.link.send(dict(op="arm", shape=list(self.shape)))
        inputs = make_random_inputs(self.shape, seed=seed, device=self.device, qk_std=self.qk_std)
        if self.idle_s:
            # The GPU left idle before every call, calibrated ones too: a call's time depends on
            # what the GPU did just before it (Limits.timing_idle_ms). Idle before the inputs
            # reach the buffers the subject can read: a subject watching them could use an idle
            # GPU after them to compute the call's output before "go".
            synchronize(self.device)
            time.sleep(self.idle_s)
        for dst, src in zip((self.q, self.k, self.v), inputs):
            dst.copy_(src)
        self.o.fill_(float("nan"))
        self.flush.zero_()
        self.link.drain()
        synchronize(self.device)
        clock = Clock(self.device)
        n, request = self.link.encode(dict(op="go"))
        clock.go()
        self.link.write(request)
        reply = self.link.receive(self.deadline, expect=n)
        clock.returned()
        if reply.get("event") == "error":
            raise SubjectGone("runtime_error", "a timed call raised " + _error_text(reply))
        if reply.get("event") != "done":
            raise malformed("event", reply.get("event"), "not done or error")
        # Read O now: this process's first GPU work after the reply, right behind the fence event.
        self.snapshot = self.o.clone()
        synchronize(self.device)
        self.link.expect_diagnostics(n)
        self.sent.append((n, clock.t0, clock.t_reply))
        self.parts["prep"] += clock.t0 - began
        self.parts["call"] += clock.t_reply - clock.t0
        self.parts["readback"] += _perf_counter() - clock.t_reply
        return clock, inputs

    def reported(self) -> list[dict]:
        """What the subject measured about each call (its diagnostics line, sent after the
        reply; diagnostics, never ranked), in call order, with this process's go and reply
        times. Complete once a later reply has been received (the profiler's, at the end)."""
        return [dict(self.link.diagnostics.get(n, {}), t_go=t_go, t_reply=t_reply)
                for n, t_go, t_reply in self.sent]


def _reported_figures(r: dict) -> dict:
    """What one call's entry of Call.reported() says, in ms (None where it says nothing usable):
    the subject's events around the call and around its copy into O, its host clock from taking
    the request up to the work done, and the call's two trips through the pipes ("go" written
    here to its line read there, the reply written there to its reading here: one host clock,
    CLOCK_MONOTONIC, in both processes; the subject reads no line time off a GPU)."""
    pipes = None
    if all(isinstance(r.get(k), (int, float)) for k in ("t_go", "t_line", "t_replied", "t_reply")) \
            and r["t_line"]:
        pipes = _diagnostic_ms((r["t_line"] - r["t_go"] + r["t_reply"] - r["t_replied"]) * 1e3)
    return dict(events=_diagnostic_ms(r.get("subject_gpu_ms")),
                host=_diagnostic_ms(r.get("subject_ms")),
                copy=_diagnostic_ms(r.get("subject_copy_ms")), pipes=pipes)


def _diagnostic_ms(value) -> float | None:
    """A time the subject reported about itself: kept for the overhead figures, never ranked."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e7:
        return float(value)
    return None


def _median_of(values: list) -> float:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else 0.0


def corrected(walls: list[float], fences: list[float], cost: ProtocolCost) -> list[float]:
    """Per-call times: the later of the two clocks, less the protocol's calibrated cost."""
    return [max(w, f) - cost.for_call(max(w, f)) for w, f in zip(walls, fences)]

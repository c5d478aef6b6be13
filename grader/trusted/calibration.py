"""The protocol's own cost per timed call (calibrate): trusted subjects that run no submission,
`null` and CALIBRATION_KERNELS, started at once and called in turn as a timed call is; the
cost every timed call of the run has subtracted (timing.ProtocolCost)."""

from __future__ import annotations

import random
import statistics
import time
from grader.common import config
from grader.problem import Case
from grader.protocol.buffers import SharedBuffer
from grader.common.text import clean
from grader.course.verdicts import ProtocolCost
from grader.trusted.replies import SubjectGone
from grader.trusted.link import Link, allocate
from grader.trusted.run_stage import buffer_numel, run_stage_calls
from grader.trusted.subject_start import loaded, _not_said
from grader.trusted.call_checks import new_verify, verify_call
from grader.trusted.timed_calls import (_urandom, round_trip_ms, open_call, warm_up,
                                        _reported_figures, _median_of)


# Trusted subjects whose calls stand for a submission's in the calibration: real attention
# kernels on the timed case (a library's, loaded by the subject loop with no submission), whose
# own CUDA events can be believed. Their protocol costs differ by about 0.1-0.2 ms (how long the
# host takes to take up and answer a call and the GPU's context switches vary with the kernel:
# bench/protocol_probe.py); the mean of the two is what a submission's call is charged.
CALIBRATION_KERNELS = ("sdpa_cudnn", "sdpa_flash")


def calibrate(spec: dict) -> dict:
    """The protocol's own cost per timed call (timing.ProtocolCost), measured on subjects that run
    no submission, called as a timed call is (warm-up, the profiler on, each call's output then
    checked on this side as time_case checks it): `null` returns Q, so its call is the round
    trip, the GPU context switches and the copy of an output into the shared buffer;
    CALIBRATION_KERNELS do a timed call's work, which their own events time. Every timed call of
    the run has its share subtracted.

    The subjects all start at once, each starting CUDA and its profiler as a run begun early
    prepares (subject/loop.py prepare), and are then called in turn, the others waiting, each
    first making a run stage's calls (spec "cases") as a submission's subject has: a
    subject's start is most of its time, and three in turn took 54 s while a course's builds ran
    (session 15). They run no submission's code."""
    subjects: dict[str, tuple[Link, dict[str, SharedBuffer]]] = {}
    try:
        for name in ("null", *CALIBRATION_KERNELS):
            subjects[name] = _spawn_prepared_builtin(spec, name)
        # Every subject's start (CUDA's, the profiler's) ends before the first calibrated call;
        # one that does not get there in time is closed at once. One deadline for all: a reply
        # that came while an earlier one was awaited is read within a few seconds more.
        deadline = time.monotonic() + spec["deadline_s"]
        waited = {}
        for name, (link, _) in subjects.items():
            waited[name] = _not_said(link, max(deadline, time.monotonic() + 5), "prepared")
            if waited[name]:
                link.close()

        def calls(name: str) -> dict:
            if waited[name]:
                return dict(failed=dict(status="runtime_error", message=waited[name]),
                            output=subjects[name][0].output())
            return _calibration_calls(spec, name, subjects[name])

        idle = calls("null")
        if "failed" in idle:
            return idle
        busy = {name: calls(name) for name in CALIBRATION_KERNELS}
    finally:
        for link, _ in subjects.values():
            link.close()
    cost = ProtocolCost(idle_ms=statistics.median(idle["raw"]))
    medians = [(statistics.median(raw - events for raw, events in b["pairs"]),
                statistics.median(events for _, events in b["pairs"]))
               for b in busy.values() if "failed" not in b and b["pairs"]]
    if len(medians) == len(CALIBRATION_KERNELS):
        cost = ProtocolCost(idle_ms=cost.idle_ms, busy_ms=statistics.fmean(m[0] for m in medians),
                            busy_work_ms=min(m[1] for m in medians))
    return dict(floor_ms=cost.idle_ms, protocol=cost.to_dict(), rtt_ms=idle["rtt_ms"],
                breakdown={name: r.get("breakdown") or clean(r["failed"].get("message"), 500)
                           for name, r in dict(null=idle, **busy).items()},
                output="".join(r.get("output", "") for r in (idle, *busy.values())))


def _spawn_prepared_builtin(spec: dict, name: str) -> tuple[Link, dict[str, SharedBuffer]]:
    """A subject for the builtin `name`, started on buffers of its own for every case it will be
    called on (run_stage.buffer_numel), that prepares (CUDA, the profiler's first start), says
    "prepared" and then waits for "load"."""
    buffers = allocate(spec["device"], buffer_numel(spec))
    return Link(dict(spec, target=dict(kind="builtin", name=name), prepare=True), buffers), buffers


def _calibration_calls(spec: dict, name: str,
                       prepared: tuple[Link, dict[str, SharedBuffer]] | None = None) -> dict:
    """The calibration's calls on the builtin `name`: on `prepared` (_spawn_prepared_builtin),
    or on a subject started here, after a run stage's calls (run_stage.run_stage_calls), as a
    submission's timed calls come after its run stage's."""
    deadline = time.monotonic() + spec["deadline_s"]
    case = Case.from_dict(spec["case"])
    target_spec = dict(spec, target=dict(kind="builtin", name=name))
    failed = None
    if prepared is not None:   # it said "prepared": load its target now
        why = _not_said(prepared[0], deadline, "loading", send=b"load\n")
        failed = (dict(status="runtime_error", message=why) if why
                  else loaded(prepared[0], target_spec, deadline))
    if failed is not None:
        prepared[0].close()
        return dict(failed=failed, output=prepared[0].output())
    opened, failed = run_stage_calls(target_spec, prepared)
    if failed is not None:
        return failed
    deadline = time.monotonic() + spec["deadline_s"]   # (the calls before had the run stage's)
    link, call = open_call(target_spec, deadline, opened)
    verify, pick = new_verify(), random.Random(_urandom(16))
    try:
        # Longer than a timed loop's warm-up: one cost serves the whole run, and the first calls
        # of a run find the GPU and its clocks cold.
        first = warm_up(link, call, deadline, calls=config.TIMING_WARMUP_CALLS
                        + spec.get("warmup", config.CALIBRATION_WARMUP_CALLS))
        clocks = []
        for i in range(spec.get("reps", config.CALIBRATION_CALLS)):
            clock, inputs = call.run(seed=i)
            clocks.append((clock.wall_ms, clock.fence_ms()))
            # What time_case does on the GPU between two timed calls, done here too: the cost
            # measured must include what that work does to the next call (the GPU switching to
            # this process's context and back, its clocks). Without it, session 9's timed calls
            # paid 0.2-0.35 ms a call more than the calibration had measured (notes/gpu_runs.md).
            # (`null` returns Q: its outputs are wrong by design; the work is what counts.)
            verify_call(verify, i, call.snapshot, inputs, case, pick)
            del inputs
        link.receive(deadline, expect=link.send(dict(op="profile", on=False)))
        rtt = round_trip_ms(link, deadline)
    except SubjectGone as gone:
        return dict(failed=dict(status=gone.status, message=gone.message), output=link.output())
    finally:
        link.close()
    parts = [(max(wall, fence), wall, fence, _reported_figures(r))
             for (wall, fence), r in zip(clocks, call.reported()[first:])]
    return dict(raw=[p[0] for p in parts], pairs=[(p[0], p[3]["events"]) for p in parts
                                                  if p[3]["events"] is not None],
                rtt_ms=rtt, output=link.output(), verify=verify,
                breakdown=dict(wall_ms=_median_of([p[1] for p in parts]),
                               fence_ms=_median_of([p[2] for p in parts]),
                               subject_events_ms=_median_of([p[3]["events"] for p in parts]),
                               subject_host_ms=_median_of([p[3]["host"] for p in parts])))

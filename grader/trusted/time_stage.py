"""The time stage: the timed loop on the largest case (time_case), on the run stage's subject, a
fresh one or one prepared before its turn (time_prepared), each after a run stage's calls; its
stopping rules, the checks between calls, NVML's view of the GPU, and the statistics and record
it ends with."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from grader.common import config
from grader.problem import Case
from grader.course.results import LOOP_PARTS, TIME_PHASES
from grader.protocol.buffers import SharedBuffer
from grader.trusted.timing import relative_standard_error, summarize
from grader.course.verdicts import ProtocolCost
from grader.trusted.replies import SubjectGone, launched
from grader.trusted.link import Link, allocate
from grader.trusted.subject_start import start_prepared, _gone_record
from grader.trusted.gpu_watch import BusyWatch, gpu_helpers
from grader.trusted.call_checks import new_verify, verify_call, _keep_sample, check_samples
from grader.trusted.timed_calls import (Call, _perf_counter, _urandom, round_trip_ms, open_call,
                                        warm_up, _reported_figures, _median_of, corrected,
                                        coarse_enough, slow_enough)
from grader.trusted.run_stage import buffer_numel, phases, run_stage_calls


def time_case(spec: dict, opened: tuple[Link, dict[str, SharedBuffer]] | None = None,
              begun: float | None = None, on_timed: Callable[[], None] | None = None,
              after_run_stage: bool = False) -> dict:
    """Timing statistics of one case, measured here, with what each call's output and the GPU's
    processes showed; on `opened`'s subject if given, else on one started here. Unless it comes
    `after_run_stage` (harness.run_then_time), the subject first makes a run stage's calls
    (run_stage.run_stage_calls: one path for every timed row, within the run stage's limits;
    the stage's own limit, spec "deadline_s", starts after them). `begun`: when the stage
    began, if before this call (time_prepared's turn: its "open" part is the submission's load
    and those calls).
    `on_timed`: called once the timed calls are over and the subject is gone, before the
    statistics and the spot checks (trusted work only, which may run beside another
    submission's run stage: harness.run_then_time says "timed")."""
    case = Case.from_dict(spec["case"])
    begun = time.monotonic() if begun is None else begun
    deadline = begun + spec["deadline_s"]
    if not after_run_stage:
        opened, failed = run_stage_calls(spec, opened)
        if failed is not None:
            return failed
        deadline = time.monotonic() + spec["deadline_s"]
    link, call = open_call(spec, deadline, opened)
    ends = [("open", time.monotonic())]   # where the stage's time goes: results.TIME_PHASES
    pick = random.Random(_urandom(16))   # which calls and heads are checked: decided here
    result: dict = dict(verify=new_verify())
    try:
        rtt_ms = round_trip_ms(link, deadline)
        ends.append(("rtt", time.monotonic()))
        cost = ProtocolCost.from_dict(spec.get("protocol"))
        first = warm_up(link, call, deadline, slow_ms=spec.get("slow_ms"))
        ends.append(("warmup", time.monotonic()))
        (walls, fences, times, samples, helpers, stopped_by, loop_start,
         busy) = _timed_loop(spec, link, call, case, cost, pick, result["verify"], deadline)
        ends.append(("loop", time.monotonic()))
        call.parts["rest"] = (_perf_counter() - loop_start) - sum(call.parts.values())
        report = link.receive(deadline, expect=link.send(dict(op="profile", on=False)))
        kernels = launched(report.get("kernels"), "kernels",
                           (_perf_counter() - call.profiled_from) * 1e3)
    except SubjectGone as gone:
        record = _gone_record(gone, link, spec, loading=False,
                              limit=f"{spec['deadline_s']:.0f} s, the limit for timing")
        link.close()
        return dict(failed=dict(record, message=f"timing {case.id}: {record['message']}"),
                    output=link.output())
    link.close()
    if on_timed is not None:
        on_timed()
    reported = [_reported_figures(r) for r in call.reported()[first:]]
    stats = summarize(times, flops=case.flops, warmup_calls=first,
                      budget_s=spec["budget_s"], stopped_by=stopped_by,
                      wall_s=_perf_counter() - loop_start,
                      wall_median_ms=statistics.median(walls),
                      fence_median_ms=statistics.median(fences),
                      raw_mean_ms=statistics.fmean(max(w, f) for w, f in zip(walls, fences)),
                      protocol_ms=statistics.fmean(max(w, f) - t for w, f, t in zip(walls, fences, times)),
                      rtt_ms=rtt_ms,
                      subject_events_ms=_median_of([r["events"] for r in reported]),
                      subject_host_ms=_median_of([r["host"] for r in reported]),
                      subject_copy_ms=_median_of([r["copy"] for r in reported]),
                      pipe_ms=_median_of([r["pipes"] for r in reported]),
                      launched=tuple(tuple(x) for x in kernels),
                      profiled_calls=len(walls) + 1)
    ends.append(("report", time.monotonic()))
    spots = check_samples(samples, case, spec, pick)
    ends.append(("spots", time.monotonic()))
    result.update(stats=stats.to_dict(), spots=spots, phases_s=phases(begun, ends, TIME_PHASES),
                  loop_s={k: round(v, 4) for k, v in call.parts.items()}, times_ms=times,
                  calls=[[max(w, f), r["events"]] for w, f, r in zip(walls, fences, reported)],
                  helpers=[h for h in helpers if h], gpu_processes_seen=any(h is not None for h in helpers),
                  gpu_busy=busy.to_dict(),
                  output=link.output())
    return result


def _timed_loop(spec: dict, link: Link, call: Call, case: Case, cost: ProtocolCost,
                pick: random.Random, verify: dict, deadline: float) -> tuple:
    """time_case's timed calls, each output checked after its reply, until a stopping rule (the
    spec's max_calls or TIMING_MAX_REPS, outputs wrong as a rule, the target precision, a coarse
    or slow placing, the budget, or the stage's `deadline` too near for one more call and the spot checks: 'bound'):
    (walls, fences, times, samples kept, helpers seen, what stopped it, when it began, what NVML
    saw of the GPU meanwhile)."""
    device = spec["device"]
    walls, fences, times, samples, helpers = [], [], [], [], []
    watch = BusyWatch(link)
    stopped_by, loop_start = "max_reps", _perf_counter()
    watch.start()
    call.parts = dict.fromkeys(LOOP_PARTS, 0.0)
    while len(walls) < spec.get("max_calls", config.TIMING_MAX_REPS):
        seed = int.from_bytes(_urandom(8), "little") >> 1
        clock, inputs = call.run(seed)
        walls.append(clock.wall_ms)
        fences.append(clock.fence_ms())
        times += corrected(walls[-1:], fences[-1:], cost)
        t = _perf_counter()
        verify_call(verify, len(walls) - 1, call.snapshot, inputs, case, pick)
        call.parts["verify"] += _perf_counter() - t
        _keep_sample(samples, pick, len(walls) - 1, seed, call.snapshot, config.TIMING_SPOT_SAMPLES)
        t = _perf_counter()
        if device == "cuda" and (len(walls) - 1) % config.TIMING_PROCESS_CHECK_EVERY == 0:
            helpers.append(gpu_helpers(link))
        if watch.due():
            watch.read()
        call.parts["helpers"] += _perf_counter() - t
        del inputs
        if wrong_enough(verify):
            stopped_by = "wrong"
            break
        if len(times) >= config.TIMING_MIN_REPS and relative_standard_error(times) < config.TIMING_TARGET_RSE:
            stopped_by = "rse"
            break
        if coarse_enough(times, spec.get("coarse_ms")) or slow_enough(times, spec.get("slow_ms")):
            stopped_by = "coarse"
            break
        if not _may_stop_early(times, spec):
            continue
        if time.monotonic() + 2 * (max(walls[-1], fences[-1]) / 1e3) + config.TIMING_SPOT_RESERVE_S \
                > deadline:   # one more call might not end in time: what was timed places it
            stopped_by = "bound"
            break
        if _perf_counter() - loop_start > spec["budget_s"] and len(times) >= 2:
            stopped_by = "budget"
            break
    t = _perf_counter()
    busy = watch.stop(calls=len(walls))
    call.parts["helpers"] += _perf_counter() - t
    return walls, fences, times, samples, helpers, stopped_by, loop_start, busy


def wrong_enough(verify: dict) -> bool:
    """Whether the calls' outputs are wrong as a rule, not by chance (config.TIMING_WRONG_STOP):
    the time will not count, whatever the check stage finds, so more calls would only hold the
    GPU. A kernel wrong now and then is timed on, and its count of wrong calls reported."""
    return (verify["wrong"] >= config.TIMING_WRONG_STOP
            and 2 * verify["wrong"] > verify["checked"])


def _may_stop_early(times: list[float], spec: dict) -> bool:
    """Whether the budget or the stage's limit may end the loop now: after TIMING_MIN_REPS calls
    (or the spec's max_calls), or before them only for calls slower than coarse_ms. Otherwise a
    kernel fast in its first calls could end the loop with one long call and be ranked on a few
    calls of a cool GPU (made back to back, the first 10 of 100 calls ran about 5% faster than
    the last 10: notes/throughput.md, session 17); it is called on, and a limit it passes is its
    timeout. Without a measured peak (coarse_ms None: no GPU) nothing is ranked, and the budget
    ends the loop."""
    if len(times) >= min(config.TIMING_MIN_REPS, spec.get("max_calls", config.TIMING_MAX_REPS)):
        return True
    coarse = spec.get("coarse_ms")
    return coarse is None or statistics.median(times) > coarse


def time_prepared(spec: dict) -> dict:
    """A time stage on a subject prepared before its turn (spec "prepare"; harnesses.TimeSubject,
    when run stages share the GPU, config.GPU_LANES): the subject starts with CUDA and its
    profiler and no submission code, "prepared" is said, and on "run" the submission is loaded
    (its JIT cache filled by its run stage, on another subject since killed), makes a run stage's
    calls and is timed (time_case). A subject that does not get to its turn: this process ends with
    no record (_give_up), and the pipeline times the submission on a new harness."""
    buffers = allocate(spec["device"], buffer_numel(spec))
    ends: list = []
    link, failed, _ = start_prepared(spec, buffers, ends)
    turn = ends[-1][1]   # "waiting" ended: the turn began, on the GPU stages' CPUs
    if failed is not None:
        link.close()
        return dict(failed=failed, output=link.output())
    return time_case(spec, opened=(link, buffers), begun=turn)

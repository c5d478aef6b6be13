"""The run stage: every case called once under the profiler, on inputs this process wrote, its
output O read here and saved for the checker; each reply checked into the case's record
(call_record, output_problem), a death pinned to its case, and where the stage's time went
(phases). And a run stage's calls made again before any timed loop on a subject that has not
made them (run_stage_calls: one path for every timed row)."""

from __future__ import annotations

import time
from pathlib import Path
import torch
from grader.problem import Case
from grader.problem import make_inputs
from grader.course.results import RUN_PHASES
from grader.protocol.buffers import SharedBuffer
from grader.common.text import clean
from grader.trusted.replies import (SubjectGone, malformed, number, launched, returned_description,
                                    memory_bytes, _error_text)
from grader.trusted.link import Link, synchronize, allocate
from grader.trusted.subject_start import start, start_prepared, _gone_record
from grader.trusted.timed_calls import _perf_counter
from grader.trusted.outputs import output_path, save_output


def run_cases(spec: dict) -> dict:
    """Each case once, profiled; O saved to <out_dir>/<case>.f16 for the checker (outputs.py)."""
    link, buffers, records, phases = _run_all(spec)
    link.close()
    return dict(cases=records, output=link.output(), phases_s=phases)


def buffer_numel(spec: dict) -> int:
    """Elements of each buffer shared with the subject: enough for every case it is called on
    (the spec's "cases", the run stage's, and "case", the timed one)."""
    cases = [*spec.get("cases", ()), *([spec["case"]] if "case" in spec else [])]
    return max(Case.from_dict(c).numel for c in cases)


def _run_all(spec: dict) -> tuple[Link, dict[str, SharedBuffer], dict[str, dict], dict]:
    """The subject started on buffers for the largest case and every case run once: its link
    (still open), the buffers, a record per case and where the time went (RUN_PHASES)."""
    device, out_dir = spec["device"], Path(spec["out_dir"])
    cases = [Case.from_dict(c) for c in spec["cases"]]
    ends = [("harness", time.monotonic())]
    deadline = time.monotonic() + spec["deadline_s"]
    buffers = allocate(device, buffer_numel(spec))
    synchronize(device)
    ends.append(("buffers", time.monotonic()))
    if spec.get("prepare"):
        link, failed, deadline = start_prepared(spec, buffers, ends)
        ends.append(("load", time.monotonic()))
    else:
        link, failed = start(spec, buffers, deadline)
        ends.append(("subject", time.monotonic()))
    if failed is not None:   # it did not load: the first case says why
        records = {case.id: failed if i == 0 else dict(
            status="runtime_error", message="not run: the submission did not load")
            for i, case in enumerate(cases)}
    else:
        try:
            records, _ = run_each(link, cases, buffers, device, deadline, spec, out_dir)
        except BaseException:
            link.close()
            raise
    ends.append(("cases", time.monotonic()))
    return link, buffers, records, phases(spec.get("spawned"), ends)


def run_each(link: Link, cases: list[Case], buffers: dict[str, SharedBuffer], device: str,
             deadline: float, spec: dict, out_dir: Path | None
             ) -> tuple[dict[str, dict], Case | None]:
    """Each case called once under the profiler, in order (run_one), each output saved in
    `out_dir` (None: not kept): a record per case, and the case that ended the process or its
    CUDA context (None if none did), after which no case runs."""
    records: dict[str, dict] = {}
    rest, ended = None, None   # the record of every case after one that ended the process
    for case in cases:
        if rest is not None:
            records[case.id] = rest
            continue
        records[case.id], rest = run_one(link, case, buffers, out_dir, device, deadline, spec)
        if rest is not None:
            ended = case
    return records, ended


def run_stage_calls(spec: dict, opened: tuple[Link, dict[str, SharedBuffer]] | None = None
                    ) -> tuple[tuple[Link, dict[str, SharedBuffer]] | None, dict | None]:
    """One path for every timed loop: a subject is timed only after the calls a run stage makes
    (spec "cases", each once under the profiler, in order), as a submission's time stage runs on
    its run stage's subject (harness.run_then_time). The baselines', the calibration's and a
    time stage's own subject (GPU lanes, or a new one) make them here first, their outputs not
    kept, so that every timed row, and the cost subtracted from it, comes after the same calls.
    Timed on fresh subjects, the baselines and the calibration cost 0.09-0.18 ms a call less
    beyond their own events than the submissions in sessions 26-27, so the one cost subtracted
    fell between them; on this path, 0.01-0.06 ms (notes/throughput.md, session 28). On
    `opened`, or on a subject started here (its start and the calls within the run stage's
    limits: spec "run_deadline_s" and "case_limits"; the timed loop's own limit starts after
    them). A case's error is a call made, as in a run stage; a subject that died, hung or lost
    its CUDA context is not timed: (None, its failure record, which says nothing the subject
    printed, and names no hidden case: the instructor's log has the rest)."""
    device, cases = spec["device"], [Case.from_dict(c) for c in spec.get("cases") or ()]
    if not cases:
        raise ValueError("a timed subject's spec names no run stage cases ('cases'): "
                         "grader/stages/time.py time_fields gives them")
    deadline = time.monotonic() + spec.get("run_deadline_s", spec["deadline_s"])
    if opened is None:
        buffers = allocate(device, buffer_numel(spec))
        link, failed = start(spec, buffers, deadline)
        if failed is not None:
            link.close()
            return None, dict(failed=failed, output=link.output())
    else:
        link, buffers = opened
    try:
        records, ended = run_each(link, cases, buffers, device, deadline, spec, out_dir=None)
    except BaseException:
        link.close()
        raise
    if ended is None:
        return (link, buffers), None
    link.close()
    status = records[ended.id]["status"]
    where = "a hidden case" if ended.hidden else f"case {ended.id}"
    what = "timed out" if status == "timeout" else "ended or lost its CUDA context"
    return None, dict(failed=dict(status=status, message=(
        f"before its timed calls, the run stage's calls were made again, and the submission "
        f"{what} on {where}, which it had passed in the run stage: look for a kernel that fails "
        f"now and then (a race between threads or blocks, memory read before it is written)")),
        output=link.output())


def phases(start: float | None, ends: list[tuple[str, float]],
           names: tuple[str, ...] = RUN_PHASES) -> dict[str, float]:
    """Seconds of each phase (results.RUN_PHASES, or `names`), from (phase, monotonic time it
    ended) in order, each beginning where the one before ended and the first at `start`: the
    spec's "spawned", the pipeline's CLOCK_MONOTONIC time on handing this process its spec (one
    clock machine-wide), or None when unknown, and then that phase is left out."""
    out = {}
    for name, end in ends:
        assert name in names, name
        if start is not None:
            out[name] = round(end - start, 3)
        start = end
    return out


def run_one(link: Link, case: Case, buffers, out_dir: Path | None, device: str, deadline: float,
            spec: dict) -> tuple[dict, dict | None]:
    """(record of this case, record for the cases after it if none of them can run)."""
    q, k, v, o = (buffers[n].view(case.shape) for n in "qkvo")
    for dst, src in zip((q, k, v), make_inputs(case, device)):
        dst.copy_(src)
    o.fill_(float("nan"))
    synchronize(device)
    start_s = _perf_counter()
    case_s = spec.get("case_limits", {}).get(case.id)   # on a GPU: from the case's size
    limit = ""
    if case_s is not None and time.monotonic() + case_s < deadline:
        deadline = time.monotonic() + case_s
        limit = f"{case_s:.0f} s, the limit for a case of this size"
    try:
        reply = link.receive(deadline, expect=link.send(dict(op="call", shape=list(case.shape),
                                                             profile=True)))
        elapsed = _perf_counter() - start_s
        record = call_record(reply, device, elapsed)
    except SubjectGone as gone:
        record = _gone_record(gone, link, spec, loading=False, limit=limit)
        why = ("the subject broke the protocol" if gone.message.startswith("the subject broke")
               else "the process ended")
        return record, dict(status="runtime_error", message=f"not run: {why} during case {case.id}")
    if record["status"] != "pass":
        if record.pop("context_lost", False):
            return record, dict(status="runtime_error",
                                message=f"not run: the CUDA context was lost in case {case.id}")
        return record, None
    problem = output_problem(record.pop("returned"), case)
    if problem:
        record["problem"] = problem
    elif out_dir is not None:
        save_output(o, output_path(out_dir, case.id))
    return record, None


def call_record(reply: dict, device: str, elapsed: float) -> dict:
    """A "call" reply, checked (every field read: "what the subject reports, checked"), as this
    case's record: "pass" with what it launched and what it returned (for output_problem), or
    the error it raised ("context_lost" when its CUDA context is gone), or not_run."""
    event, window_ms = reply.get("event"), elapsed * 1e3
    if event == "not_run":   # TileLang compiled, with no GPU to launch on (subject/loop.py)
        if device == "cuda":
            return dict(status="runtime_error", message="the subject claimed there is no GPU to "
                        "run on, on a GPU")
        return dict(status="not_run", message=clean(reply.get("message"), 1000),
                    launched=launched(reply.get("launched"), "launched", window_ms))
    if event == "error":
        if not isinstance(reply.get("context_alive"), bool):
            raise malformed("context_alive", reply.get("context_alive"), "not true or false")
        return dict(status="runtime_error", message=_error_text(reply),
                    context_lost=not reply["context_alive"])
    if event != "done":
        raise malformed("event", event, "not done, error or not_run")
    return dict(status="pass", message="", elapsed_s=elapsed,
                launched=launched(reply.get("launched"), "launched", window_ms),
                peak_memory_bytes=number(reply.get("peak_memory_bytes"), "peak_memory_bytes",
                                         high=memory_bytes(device), integer=True,
                                         unit=" bytes, the device's memory"),
                returned=returned_description(reply.get("returned")))


def output_problem(returned: dict, case: Case) -> str:
    """Why what the call returned cannot be O, from the subject's description; '' if it can."""
    if returned.get("type") != "Tensor":
        return (f"returned {clean(returned.get('type'), 80)}, expected a torch.Tensor of shape "
                f"{tuple(case.shape)}")
    shape = tuple(returned.get("shape") or ())
    if shape != tuple(case.shape):
        return f"output has shape {shape}, expected {tuple(case.shape)} (batch, heads, seq, head_dim)"
    if returned.get("dtype") != "float16":
        return f"output dtype is torch.{clean(returned.get('dtype'), 40)}, expected torch.float16"
    return ""

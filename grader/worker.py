"""The submission's own process: load it, run it on every case, or time it on one.

This is the only process that imports submission code. It never computes the reference or
compares outputs (that happens in the checker, a different process), and it imports the timing
code before the submission, so what the submission does to torch or time cannot reach it.

    python -m grader.worker run  --spec SPEC.json   # outputs of every case -> files
    python -m grader.worker time --spec SPEC.json   # timing statistics of one case -> file
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

import torch

from . import timing  # (captures the clocks before any submission code is loaded)
from .cases import Case
from .inputs import make_inputs
from .loader import load_baseline, load_extension, load_python_submission


def load_callable(spec: dict):
    target = spec["target"]
    if target["kind"] == "cuda":
        return load_extension(target["artifact"], target["module_name"])
    if target["kind"] == "python":
        return load_python_submission(target["source"])
    return load_baseline(target["name"])


def _append(path: Path, record: dict) -> None:
    """One JSON line per event, flushed at once: if the process dies, the parent knows where."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _context_alive(device: str) -> bool:
    if device != "cuda":
        return True
    try:
        timing._synchronize()
        return True
    except Exception:
        return False


def profiled_call(fn, args, device: str):
    """Call fn(*args) under torch.profiler; returns (output, launched), launched as
    timing.launched_names lists it."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        out = fn(*args)
        if device == "cuda":
            timing._synchronize()   # captured before the submission was imported
    return out, timing.launched_names(prof, device)


def poison_free_memory(like: torch.Tensor, device: str, copies: int = 4) -> None:
    """Fill memory the caching allocator is about to hand out with NaN: an output the submission
    allocates but never writes (torch::empty, half the heads) then reads back as NaN, whatever
    ran before, and never passes."""
    if device != "cuda":
        return
    blocks = [torch.full_like(like, float("nan")) for _ in range(copies)]
    del blocks   # back to the allocator's cache, still NaN


def run_cases(spec: dict) -> None:
    device = spec["device"]
    out_dir, events = Path(spec["out_dir"]), Path(spec["events"])
    fn = load_callable(spec)
    cases = [Case.from_dict(c) for c in spec["cases"]]
    for i, case in enumerate(cases):
        _append(events, {"case": case.id, "event": "start"})
        q, k, v = make_inputs(case, device)
        poison_free_memory(q, device)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        start = timing._perf_counter()
        try:
            # The checked call is the profiled call: what it launched is what produced its output.
            out, launched = profiled_call(fn, (q, k, v), device)
            elapsed = timing._perf_counter() - start
            if not isinstance(out, torch.Tensor):
                raise TypeError(f"returned {type(out).__name__}, expected a torch.Tensor "
                                f"of shape {tuple(case.shape)}")
            torch.save(out.detach().to("cpu"), out_dir / f"{case.id}.pt")
        except Exception as e:  # the submission's fault: recorded for this case, then go on
            alive = _context_alive(device)
            _append(events, {"case": case.id, "event": "error", "error": type(e).__name__,
                             "message": str(e)[:4000],
                             "traceback": traceback.format_exc(limit=8)[-6000:],
                             "context_alive": alive})
            if not alive:   # a CUDA error poisons the context: nothing after it can run here
                for rest in cases[i + 1:]:
                    _append(events, {"case": rest.id, "event": "skipped",
                                     "message": f"not run: the CUDA context was lost in case {case.id}"})
                return
            continue
        peak = torch.cuda.max_memory_allocated() if device == "cuda" else 0
        _append(events, {"case": case.id, "event": "done", "elapsed_s": elapsed,
                         "peak_memory_bytes": peak, "launched": launched})
        del q, k, v, out


def time_case(spec: dict) -> None:
    """Timing statistics -> spec['out']; the sampled timed calls' outputs -> spot_<i>.pt beside it."""
    case = Case.from_dict(spec["case"])
    fn = load_callable(spec)
    stats, samples = timing.time_kernel(fn, case.shape, flops=case.flops, budget_s=spec["budget_s"],
                                        l2_bytes=spec["l2_bytes"], device=spec["device"],
                                        record_launches=spec.get("record_launches", False))
    out = Path(spec["out"])
    spots = []
    for i, sample in enumerate(samples):
        path = out.parent / f"spot_{i}.pt"
        output = sample.output.detach().to("cpu") if isinstance(sample.output, torch.Tensor) else None
        torch.save(output, path)
        spots.append(dict(call=sample.call, seed=sample.seed, file=str(path)))
    out.write_text(json.dumps(dict(stats=stats.to_dict(), spots=spots)))


def _flush() -> None:
    sys.stdout.flush()
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m grader.worker")
    p.add_argument("mode", choices=["run", "time"])
    p.add_argument("--spec", type=Path, required=True)
    a = p.parse_args(argv)
    spec = json.loads(a.spec.read_text())
    try:
        (run_cases if a.mode == "run" else time_case)(spec)
    except Exception:
        traceback.print_exc()
        _flush()
        os._exit(3)
    _flush()
    # Skip interpreter teardown: a broken extension can crash in its destructors after the work.
    os._exit(0)


if __name__ == "__main__":
    main()

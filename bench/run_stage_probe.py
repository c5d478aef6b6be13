"""Where the run stage's "cases" part goes (issue 13), case by case, for one trusted submission.

    python bench/run_stage_probe.py [examples/triton_flash] [--out bench/run_stage_probe.json]

The run stage calls each case once, under a profiler of its own (grader/subject/loop.py's "call"
with profile=True), in one subject process. This script does the same in one process, with the
subject's own loader and kernel listing, and times the parts of each case's call: the profiler's
start, the first call (a JIT compiles here), its stop, reading the kernels it saw, and the copy of
O the harness saves for the checker. Then, on the same shapes, a second profiled call and an
unprofiled one: what the first call paid for compiling and what the profiler costs. Before the
cases: the torch import, CUDA's start and the submission's import. A trusted submission only: it
runs here, with no sandbox. Writes the figures with the device and the date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

t0 = time.perf_counter()
import torch  # noqa: E402

IMPORT_TORCH_S = time.perf_counter() - t0

from grader.common import config  # noqa: E402
from grader.problem import load_all_cases  # noqa: E402
from grader.problem import make_inputs  # noqa: E402
from grader.subject.loop import launched_names  # noqa: E402
from grader.subject.load import load_python  # noqa: E402


def timed(fn):
    start = time.perf_counter()
    value = fn()
    torch.cuda.synchronize()
    return value, round(time.perf_counter() - start, 4)


def profiled_call(kernel, q, k, v) -> dict:
    """One call as the run stage makes it, each part timed."""
    from torch.profiler import ProfilerActivity, profile
    parts = {}
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    _, parts["profiler_start"] = timed(prof.__enter__)
    out, parts["call"] = timed(lambda: kernel(q, k, v))
    _, parts["profiler_stop"] = timed(lambda: prof.__exit__(None, None, None))
    names, parts["kernel_list"] = timed(lambda: launched_names(prof, "cuda"))
    parts["kernels"] = len(names)
    return out, parts


def probe(submission: Path) -> dict:
    folder = config.REPO_ROOT / "test_cases"
    cases = load_all_cases(folder / "test.txt", folder / "hidden.txt")   # the grader's order
    _, cuda_s = timed(lambda: torch.zeros(1, device="cuda"))
    kernel, import_s = timed(lambda: load_python(str(submission / "submission.py")))
    rows = []
    for case in cases:
        q, k, v = make_inputs(case, "cuda")
        out, first = profiled_call(kernel, q, k, v)
        _, save_s = timed(lambda: out.detach().to("cpu").clone())
        _, second = profiled_call(kernel, q, k, v)
        _, bare_s = timed(lambda: kernel(q, k, v))
        rows.append(dict(case=case.id, shape=list(case.shape), first=first, save_s=save_s,
                         second=second, unprofiled_call_s=bare_s))
        del q, k, v, out
    total = {part: round(sum(r["first"][part] for r in rows), 3)
             for part in ("profiler_start", "call", "profiler_stop", "kernel_list")}
    total["save"] = round(sum(r["save_s"] for r in rows), 3)
    total["jit (first call - second)"] = round(sum(r["first"]["call"] - r["second"]["call"] for r in rows), 3)
    total["profiler (second profiled - unprofiled)"] = round(sum(
        r["second"]["profiler_start"] + r["second"]["call"] + r["second"]["profiler_stop"]
        + r["second"]["kernel_list"] - r["unprofiled_call_s"] for r in rows), 3)
    return dict(submission=str(submission.relative_to(ROOT)), import_torch_s=round(IMPORT_TORCH_S, 3),
                cuda_start_s=cuda_s, import_submission_s=import_s, cases=rows, totals=total,
                median_unprofiled_call_s=statistics.median(r["unprofiled_call_s"] for r in rows))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("submission", nargs="?", default="examples/triton_flash", type=Path)
    p.add_argument("--out", default=ROOT / "bench" / "run_stage_probe.json", type=Path)
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("run_stage_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    figures = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                   date=datetime.date.today().isoformat(), **probe((ROOT / a.submission).resolve()))
    a.out.write_text(json.dumps(figures, indent=1) + "\n")
    print(f"{figures['device']}, {figures['date']}: torch import {figures['import_torch_s']} s, "
          f"CUDA start {figures['cuda_start_s']} s, submission import {figures['import_submission_s']} s")
    print(f"{'case':10s} {'prof start':>10s} {'1st call':>9s} {'prof stop':>9s} {'list':>6s} "
          f"{'save':>6s} {'2nd call':>9s} {'bare':>7s}")
    for r in figures["cases"]:
        f, s = r["first"], r["second"]
        print(f"{r['case']:10s} {f['profiler_start']:10.3f} {f['call']:9.3f} {f['profiler_stop']:9.3f} "
              f"{f['kernel_list']:6.3f} {r['save_s']:6.3f} {s['call']:9.3f} {r['unprofiled_call_s']:7.3f}")
    print("totals, s:", json.dumps(figures["totals"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

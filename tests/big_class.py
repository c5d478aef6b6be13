"""A 300-student class for the page's layout tests: the real GPU run's results, copied with
new ids, statuses and times, plus long, accented and hostile names."""

from __future__ import annotations

import dataclasses
import random
import shutil
from pathlib import Path

from grader.course.results import read_results, write_result
from grader.common.status import Status
from grader.trusted.timing import summarize

FIXTURES = Path(__file__).parent / "fixtures" / "gpu_run"
NAMES = ["a-very-long-folder-name-that-someone-chose-for-their-submission-2026",
         "José_García_Martínez", "<img src=x onerror=alert(1)>", "x"]


def make_class(out: Path, n: int = 300, seed: int = 12) -> Path:
    """Write `n` student results (and the fixture's baselines and run file) into `out`."""
    shutil.copytree(FIXTURES, out)
    for p in out.glob("*.json"):
        if not p.name.startswith("_"):
            p.unlink()
    templates = {r.status: r for r in read_results(FIXTURES) if r.role == "student"}
    passing = templates[Status.PASS]
    rng = random.Random(seed)
    weights = {Status.PASS: 0.7, Status.MISMATCH: 0.15, Status.RUNTIME_ERROR: 0.1, Status.BUILD_ERROR: 0.05}
    for i in range(n):
        status = rng.choices(list(weights), list(weights.values()))[0]
        base = templates[status]
        sid = NAMES[i] if i < len(NAMES) else f"student{i:03d}"
        timing = None
        if status is Status.PASS:
            ms = 20.0 * rng.lognormvariate(1.0, 1.0)
            flops = passing.timing.tflops * 1e12 * passing.timing.median_ms * 1e-3
            timing = summarize([ms * rng.uniform(0.99, 1.01) for _ in range(8)], flops=int(flops),
                               warmup_calls=3, budget_s=15, stopped_by="rse", wall_s=1.0)
        write_result(out, dataclasses.replace(base, id=sid, label=sid, timing=timing,
                                              message=base.message if timing is None else
                                              f"all 9 cases run pass; median {timing.median_ms:.3f} ms"))
    return out

"""What a Triton submission's run stage still pays for its JIT, and what each way of moving it out
of the turn takes away (issue 32).

    python bench/triton_warm_probe.py [examples/triton_flash] [--out bench/triton_warm_probe.json]

Four fresh processes, one per way, each with a JIT folder of its own (TRITON_CACHE_DIR), as a
run stage's subject has: CUDA started, then optionally Triton warmed as a prepared subject warms
it before its turn (grader/subject/libraries.warm_triton), then every grading case's first call,
timed to its synchronize:

    cold           an empty JIT folder, nothing warmed (the run stage as it was in session 23)
    warm           an empty JIT folder, Triton warmed first (warm_s: what moved off the turn)
    ahead          the folder seeded by the build's compile ahead (grader/build/ahead.py)
    ahead+warm     both
    ahead+warm+profiler       both, each call under the run stage's profiler (loop.py's "call")
    ahead+warm+profiler+load  the same with every CPU but two kept busy, as a course's builds do

The figure that decides each is `first_calls_s`: the cases' first calls, the run stage's JIT
part, on the GPU's critical path. A trusted submission only, no sandbox. Writes the figures with
the device and the date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ONE = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
start_s = time.perf_counter() - t0
warm_s, failed = 0.0, []
if sys.argv[3] == "1":
    from grader.subject.libraries import warm_triton
    t = time.perf_counter(); failed = warm_triton(); warm_s = time.perf_counter() - t
from grader.subject.load import load
from grader.problem import make_random_inputs
t = time.perf_counter(); fn = load(dict(kind="python", source=sys.argv[1])); load_s = time.perf_counter() - t
calls = []
profiled = sys.argv[4] == "1"   # each call under the run stage's own profiler (loop.py's "call")
if profiled:
    from torch.profiler import profile
    from grader.subject.loop import call_activities, launched_names
for shape in json.loads(sys.argv[2]):
    q, k, v = make_random_inputs(tuple(shape), seed=1, device="cuda")
    torch.cuda.synchronize()
    t = time.perf_counter()
    if profiled:
        with profile(activities=call_activities("cuda")) as prof:
            fn(q, k, v); torch.cuda.synchronize()
        launched_names(prof, "cuda")
    else:
        fn(q, k, v); torch.cuda.synchronize()
    calls.append(round(time.perf_counter() - t, 4))
print(json.dumps(dict(start_s=round(start_s, 3), warm_s=round(warm_s, 3), warm_failed=failed,
                      load_s=round(load_s, 3), first_calls_s=round(sum(calls), 3), calls_s=calls)))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("submission", nargs="?", default="examples/triton_flash")
    p.add_argument("--out", default="bench/triton_warm_probe.json")
    a = p.parse_args()
    from grader.build.ahead import compile_ahead
    from grader.common import config
    from grader.common.status import Status
    from grader.course.submission import Kind, Submission
    from grader.course.verdicts import BuildResult
    from grader.isolation.device import detect
    from grader.isolation.procs import child_env
    from grader.problem import load_all_cases
    from grader.stages.folders import jit_cache

    device = detect()
    sub = Submission(Path(a.submission).name, ROOT / a.submission, Kind.PYTHON)
    cases = load_all_cases(config.PUBLIC_CASES, config.HIDDEN_CASES)   # the grader's, in its order
    shapes = [list(c.shape) for c in cases]
    limits = config.Limits(ahead_s=90.0)
    rows = {}
    with tempfile.TemporaryDirectory(prefix="warm-probe-") as tmp:
        built = compile_ahead(sub, BuildResult(Status.PASS, "import", 1.0),
                              build_dir=Path(tmp) / "build", device=device, limits=limits,
                              sandbox=None, cases=cases, log_path=Path(tmp) / "ahead.log")
        ahead_ok = bool(built.compiled_ahead)
        for way in ("cold", "warm", "ahead", "ahead+warm", "ahead+warm+profiler",
                    "ahead+warm+profiler+load"):
            if way.startswith("ahead") and not ahead_ok:
                log = Path(tmp) / "ahead.log"
                rows[way] = dict(skipped="nothing compiled ahead: "
                                 + (log.read_text()[-500:] if log.exists() else "no log"))
                continue
            with jit_cache(sub, limits, built if way.startswith("ahead") else
                           BuildResult(Status.PASS, "import", 1.0)) as jit:
                env = {**child_env(cuda=True), "TRITON_CACHE_DIR": str(jit / "triton"),
                       "PYTHONPATH": str(ROOT)}
                # the course's load: every CPU but two busy, as the builds keep them
                load = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                        for _ in range(max(0, (os.cpu_count() or 2) - 2))] if "load" in way else []
                # the run's sandbox does not see the build folder (what it compiled is in the copy)
                (Path(tmp) / "build").rename(Path(tmp) / "build-unseen")
                try:
                    proc = subprocess.run([sys.executable, "-c", ONE, str(sub.source), json.dumps(shapes),
                                           "1" if "warm" in way else "0",
                                           "1" if "profiler" in way else "0"],
                                          env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
                finally:
                    (Path(tmp) / "build-unseen").rename(Path(tmp) / "build")
                    for busy in load:
                        busy.kill()
                rows[way] = (json.loads(proc.stdout.splitlines()[-1]) if proc.returncode == 0
                             else dict(error=proc.stderr[-1500:]))
            print(way, json.dumps(rows[way]), flush=True)
    record = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  device=device.name, uuid=getattr(device, "uuid", None), torch=device.torch_version,
                  submission=a.submission, shapes=shapes, ways=rows)
    Path(a.out).write_text(json.dumps(record, indent=1) + "\n")
    print(f"{'way':<26}{'warm s':>8}{'first calls s':>15}  calls s")
    for way, r in rows.items():
        print(f"{way:<26}{r.get('warm_s', '-'):>8}{r.get('first_calls_s', '-'):>15}  {r.get('calls_s', '')}")


if __name__ == "__main__":
    main()

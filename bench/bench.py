"""Benchmark the reference solution against the baselines on the public shapes, in one run.

    python bench/bench.py                         # solution as shipped, results -> bench/results.json
    python bench/bench.py --variant br128=-DATTN_BR=128 --variant bc32=-DATTN_BC=32

Builds every variant in parallel (child processes, as the grader builds), checks each on every
public and hidden case against the fp32 reference, then times each variant and each baseline on
each public shape with the grader's own timing code (CUDA events, warm-up, L2 flushed, fresh
inputs, RSE < 0.5% or the budget), and the skeleton's versions 1 and 2 as the bundled examples
implement them on the largest shape. Prints one table and writes the figures with the device,
driver, torch version and date; scripts/perf_table.py turns them into every figure students read.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grader.common import config  # noqa: E402
from grader.problem import BASELINES  # noqa: E402
from grader.problem import load_all_cases, load_cases  # noqa: E402
from grader.trusted.compare import compare_outputs  # noqa: E402
from grader.isolation.device import detect  # noqa: E402
from grader.problem import make_inputs  # noqa: E402
from grader.problem import attention_reference  # noqa: E402
from grader.subject.load import load_builtin, load_extension  # noqa: E402

from inprocess import time_in_process  # noqa: E402

ROOT = config.REPO_ROOT


# The skeleton's versions 1 and 2 as the bundled examples implement them: timed on the largest
# case only (~1 s a call), for the handout's and the skeleton's figures (scripts/perf_table.py).
STAGES = {"stage 1: naive (examples/naive_cuda)": ROOT / "examples" / "naive_cuda" / "submission.cu",
          "stage 2: tiled (examples/tiled_cuda)": ROOT / "examples" / "tiled_cuda" / "submission.cu"}


def build_variant(name: str, flags: list[str], arch: str, build_root: Path,
                  source: Path = config.SOLUTION_DIR / "submission.cu") -> tuple[str, Path | None, str]:
    module = f"solution_{name}"
    cmd = [sys.executable, "-m", "grader.build.stage", "extension", str(source),
           "--name", module, "--build-dir", str(build_root / module), "--arch", arch,
           "--cuda-flag=-Xptxas=-v", *[f"--cuda-flag={f}" for f in flags]]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    ptxas = "\n".join(l for l in (proc.stdout + proc.stderr).splitlines()
                      if "attention_kernel" in l or "registers" in l or "spill" in l or "wgmma" in l)
    if proc.returncode != 0:
        return name, None, (proc.stdout + proc.stderr)[-4000:]
    return name, build_root / module / f"{module}.so", ptxas


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--variant", action="append", default=[],
                   help="NAME=FLAG[,FLAG...]: another build of the solution, e.g. br128=-DATTN_BR=128")
    p.add_argument("--budget", type=float, default=4.0, help="timing budget per row and shape (s)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results.json")
    p.add_argument("--no-baselines", action="store_true")
    args = p.parse_args()

    device = detect()
    if not device.cuda:
        print("bench needs a CUDA device", file=sys.stderr)
        return 2
    variants = {"solution": []}
    for v in args.variant:
        name, _, flags = v.partition("=")
        variants[name] = [f for f in flags.split(",") if f]
    build_root = ROOT / "build" / "bench"
    with concurrent.futures.ThreadPoolExecutor(len(variants)) as pool:
        built = list(pool.map(lambda kv: build_variant(kv[0], kv[1], device.arch, build_root), variants.items()))
    kernels = {}
    for name, path, log in built:
        print(f"== {name} {' '.join(variants[name])}\n{log}")
        if path is not None:
            kernels[name] = load_extension(str(path), f"solution_{name}")
    stages = {}
    if not args.variant and not args.no_baselines:
        with concurrent.futures.ThreadPoolExecutor(len(STAGES)) as pool:
            built = list(pool.map(lambda kv: build_variant(f"stage{kv[0]}", [], device.arch, build_root,
                                                           source=kv[1][1]), enumerate(STAGES.items())))
        for (label, _), (name, path, log) in zip(STAGES.items(), built):
            if path is None:
                print(f"== {label}: build failed\n{log}")
            else:
                stages[label] = load_extension(str(path), f"solution_{name}")

    # correctness of every variant on every case
    cases = load_all_cases(config.PUBLIC_CASES, config.HIDDEN_CASES)
    broken = set()
    for case in cases:
        q, k, v = make_inputs(case, "cuda")
        ref = attention_reference(q, k, v)
        for name, fn in {**kernels, **stages}.items():
            finding = compare_outputs(fn(q, k, v), ref)
            if not finding.ok:
                broken.add(name)
                print(f"MISMATCH {name} on {case.id}: {finding.summary()}")
        del q, k, v, ref
        torch.cuda.empty_cache()

    rows = {name: fn for name, fn in kernels.items() if name not in broken}
    if not args.no_baselines:
        rows.update({b.label: load_builtin(b.name) for b in BASELINES.values()})
    rows.update({label: fn for label, fn in stages.items() if label not in broken})
    shapes = load_cases(config.PUBLIC_CASES)
    largest = max(shapes, key=lambda c: c.flops)
    figures = []
    for case in shapes:
        for label, fn in rows.items():
            if label in stages and case != largest:
                continue
            try:
                t = time_in_process(fn, case.shape, flops=case.flops, budget_s=args.budget,
                                    l2_bytes=device.l2_bytes)
            except RuntimeError as e:   # a baseline that does not run on this device
                print(f"{label} on {case.id}: {str(e).splitlines()[0]}")
                torch.cuda.empty_cache()
                continue
            figures.append(dict(case=case.id, row=label, median_ms=t.median_ms, tflops=t.tflops,
                                n=t.n, rse=t.rse, min_ms=t.min_ms))
            torch.cuda.empty_cache()

    table = format_table(figures, list(rows), [c.id for c in shapes])
    print(table)
    if not args.variant:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(dict(
            device=device.name, driver=device.driver, torch=device.torch_version,
            cuda=device.cuda_version, date=datetime.date.today().isoformat(),
            broken=sorted(broken), figures=figures), indent=1))
        print(f"\nwritten: {args.out}")
    return 1 if broken else 0


def format_table(figures: list[dict], rows: list[str], cases: list[str]) -> str:
    by = {(f["row"], f["case"]): f for f in figures}
    out = []
    for case in cases:
        out.append(f"\n{case}")
        out.append(f"  {'':22} {'ms':>9} {'TFLOP/s':>8}  {'solution / row':>14}")
        sol = by.get(("solution", case))
        for row in rows:
            f = by.get((row, case))
            if f is None:
                continue
            ratio = f["median_ms"] / sol["median_ms"] if sol else float("nan")
            out.append(f"  {row:22} {f['median_ms']:9.3f} {f['tflops']:8.1f}  {ratio:13.2f}x")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())

"""The pause's attack twin on a GPU (issue 32): peek_inputs_py, which watches its buffers between
calls and computes the next call's output as soon as the inputs are written, graded beside its
honest twin (honest_py) and rest_gpu_py, twice:

1. the grader as committed: the GPU left idle *before* the inputs are written
   (grader/trusted/timed_calls.py, Call.run), so the watcher sees them just before "go";
2. a copy of the grader with the idle moved *after* the inputs (this script edits the copy, never
   the tree): the order the commit rejected, where the watcher has the idle GPU to itself.

The twin must not beat honest_py by more than 2% in run 1 (expected.json's not_faster_than). Run 2
says whether the twin is an attack at all: a twin that gains nothing where the defence is taken
away tests nothing.

    python bench/pause_twin.py     # on the GPU machine, sandboxed; writes bench/pause_twin.json
    python bench/pause_twin.py --cpu   # the plumbing only, without a GPU (nothing is timed)
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.adversarial.verdicts import TWIN_RULES, median  # noqa: E402

WORK = ROOT / "build" / "pause-twin"
NAMES = ("honest_py", "peek_inputs_py", "rest_gpu_py")
TIMED_CALLS = Path("grader") / "trusted" / "timed_calls.py"
# The committed order in Call.run, and the same lines with the idle after the inputs' copy.
IDLE = """        if self.idle_s:
            # The GPU left idle before every call, calibrated ones too: a call's time depends on
            # what the GPU did just before it (Limits.timing_idle_ms). Idle before the inputs
            # reach the buffers the subject can read: a subject watching them could use an idle
            # GPU after them to compute the call's output before "go".
            synchronize(self.device)
            time.sleep(self.idle_s)
"""
COPY = """        for dst, src in zip((self.q, self.k, self.v), inputs):
            dst.copy_(src)
"""
LIMITS = dict(GRADER_RUN_S="30", GRADER_TIME_BUDGET_S="5")


def idle_after_inputs(source: str) -> str:
    """Call.run's source with the idle moved after the inputs' copy (the rejected order)."""
    if IDLE + COPY not in source:
        raise SystemExit(f"pause_twin: {TIMED_CALLS} no longer has the idle right before the "
                         f"inputs' copy; update IDLE and COPY here")
    return source.replace(IDLE + COPY, COPY + IDLE)


def grade(label: str, root: Path, extra: list[str]) -> dict:
    """Grade the three submissions with the grader at `root`; each one's status and median."""
    subs, out = WORK / label / "submissions", WORK / label / "results"
    subprocess.run([sys.executable, str(ROOT / "tests" / "adversarial" / "assemble.py"), str(subs),
                    *NAMES], check=True)
    proc = subprocess.run([sys.executable, "-m", "grader", "grade", str(subs), "--out", str(out),
                           "--build-dir", str(WORK / label / "build"), "--no-baselines",
                           "--no-solution", "--no-hidden", *extra],
                          cwd=root, env={**os.environ, **LIMITS}, text=True, capture_output=True)
    (WORK / f"{label}.log").write_text(proc.stdout + proc.stderr)
    rows = {}
    for name in NAMES:
        path = out / f"{name}.json"
        result = json.loads(path.read_text()) if path.exists() else {}
        rows[name] = dict(status=result.get("status", "missing"),
                          median_ms=median(result))
    return dict(exit=proc.returncode, rows=rows)


def ratio(rows: dict, name: str) -> float | None:
    mine, twin = rows[name]["median_ms"], rows["honest_py"]["median_ms"]
    return round(mine / twin, 4) if mine and twin else None


def main() -> int:
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    copy = WORK / "grader-idle-after"
    top = {"build", ".git", ".venv", ".whl", ".deb"}   # the tree's own folders, not grader/build
    shutil.copytree(ROOT, copy, ignore=lambda folder, names: [
        n for n in names if Path(folder) == ROOT and (n in top or n.startswith("results"))])
    (copy / TIMED_CALLS).write_text(idle_after_inputs((ROOT / TIMED_CALLS).read_text()))
    extra = sys.argv[1:]   # --cpu: the plumbing only, on a machine without a GPU (nothing timed)
    runs = {"idle before the inputs (committed)": grade("committed", ROOT, extra),
            "idle after the inputs (rejected)": grade("idle_after", copy, extra)}
    print(f"{'order':38s} {'honest_py':>10s} {'peek_inputs_py':>24s} {'rest_gpu_py':>24s}")
    for label, run in runs.items():
        r = run["rows"]
        cells = [f"{r['honest_py']['median_ms'] or 0:.3f} ms"]
        for name in NAMES[1:]:
            cells.append(f"{r[name]['median_ms'] or 0:.3f} ms {ratio(r, name) or 0:.3f}x {r[name]['status']}")
        print(f"{label:38s} {cells[0]:>10s} {cells[1]:>24s} {cells[2]:>24s}")
    committed = runs["idle before the inputs (committed)"]["rows"]
    got = ratio(committed, "peek_inputs_py")
    holds, bound = TWIN_RULES["not_faster_than"]   # expected.json's rule for this twin
    held = got is not None and holds(got)
    print("peek_inputs_py with the committed order: " + (
        "no median beside honest_py's: nothing to compare" if got is None else
        f"{got:.3f} x honest_py's median ({'held' if held else 'BROKEN'}: {bound})"))
    import torch
    record = dict(date=datetime.date.today().isoformat(), device=torch.cuda.get_device_name(0)
                  if torch.cuda.is_available() else "cpu", limits=LIMITS, runs=runs, held=held)
    (ROOT / "bench" / "pause_twin.json").write_text(json.dumps(record, indent=1) + "\n")
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())

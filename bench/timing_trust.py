"""The two timing-trust figures of issue 5, graded by the grader itself in one run:

1. the same kernel graded twice (two student folders with the solution's source): their medians
   must agree within 1%;
2. a submission that wraps SDPA's FLASH backend, graded in calibration mode (library calls
   allowed, nothing ranked): its median must be within 2% of the SDPA FLASH baseline row.

    python bench/timing_trust.py        # on the GPU machine; writes bench/timing_trust.json
"""

from __future__ import annotations

import datetime
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "build" / "timing-trust"
WRAPPER = '''"""Calibration only: SDPA's FLASH backend, to time against the SDPA FLASH baseline row."""
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel


def custom_kernel(data):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(*data)
'''


def main() -> int:
    subs = WORK / "submissions"
    shutil.rmtree(WORK, ignore_errors=True)
    for name in ("same_kernel_a", "same_kernel_b"):
        (subs / name).mkdir(parents=True)
        shutil.copyfile(ROOT / "solution" / "submission.cu", subs / name / "submission.cu")
    (subs / "sdpa_flash_wrapper").mkdir()
    (subs / "sdpa_flash_wrapper" / "submission.py").write_text(WRAPPER)
    out = WORK / "results"
    proc = subprocess.run([sys.executable, "-m", "grader", "grade", str(subs), "--out", str(out),
                           "--build-dir", str(WORK / "build"), "--no-solution", "--no-hidden",
                           "--calibration"], cwd=ROOT)
    results = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json") if not p.name.startswith("_")}
    flash = json.loads((out / "baselines" / "sdpa_flash.json").read_text())
    run = json.loads((out / "_run.json").read_text())
    med = {k: r["timing"]["median_ms"] for k, r in results.items() if r.get("timing")}
    med["sdpa_flash (baseline row)"] = flash["timing"]["median_ms"]
    same = abs(med["same_kernel_a"] / med["same_kernel_b"] - 1)
    calib = abs(med["sdpa_flash_wrapper"] / med["sdpa_flash (baseline row)"] - 1)
    figures = dict(device=run["device"]["name"], driver=run["device"].get("driver"),
                   date=datetime.date.today().isoformat(), timed_case=run["timed_case"],
                   medians_ms=med, same_kernel_difference=same, calibration_difference=calib,
                   same_kernel_ok=same < 0.01, calibration_ok=calib < 0.02,
                   stats={k: r["timing"] for k, r in results.items() if r.get("timing")})
    (ROOT / "bench" / "timing_trust.json").write_text(json.dumps(figures, indent=1) + "\n")
    for k, v in med.items():
        print(f"  {k:28s} {v:9.3f} ms")
    print(f"same kernel twice:  {100 * same:.2f}% apart (must be < 1%)")
    print(f"SDPA FLASH wrapper: {100 * calib:.2f}% from the baseline row (must be < 2%)")
    return 0 if proc.returncode == 0 and same < 0.01 and calib < 0.02 else 1


if __name__ == "__main__":
    sys.exit(main())

"""Regenerate the handout's performance table (student/README.md) from bench/results.json.

The table is measured, never typed: `make bench` runs the benchmark on the course GPU and then
this script. Rows: the baselines a student is compared with (not the hidden solution).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results.json"
HANDOUT = ROOT / "student" / "README.md"
ROWS = ["PyTorch reference", "SDPA FLASH", "SDPA cuDNN"]
BEGIN = re.compile(r"<!-- perf-table:begin[^>]*-->")
END = "<!-- perf-table:end -->"


def render(results: dict) -> str:
    by = {(f["row"], f["case"]): f for f in results["figures"]}
    cases = list(dict.fromkeys(f["case"] for f in results["figures"]))
    head = "| | " + " | ".join(f"`{c}`" for c in cases) + " |"
    lines = [f"Measured on an {results['device']} (driver {results['driver']}, torch "
             f"{results['torch']}, CUDA {results['cuda']}) on {results['date']}: median ms "
             f"(TFLOP/s).", "", head, "|---" * (len(cases) + 1) + "|"]
    for row in ROWS:
        cells = [f"{by[(row, c)]['median_ms']:.3f} ms ({by[(row, c)]['tflops']:.0f})"
                 if (row, c) in by else "n/a" for c in cases]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def update(handout: str, table: str) -> str:
    m = BEGIN.search(handout)
    end = handout.index(END)
    if m is None or end < m.end():
        raise SystemExit(f"{HANDOUT}: perf-table markers missing")
    return handout[:m.end()] + "\n" + table + "\n" + handout[end:]


def main() -> int:
    if not RESULTS.exists():
        print(f"{RESULTS} does not exist: run `make bench` on the GPU machine first", file=sys.stderr)
        return 2
    text = HANDOUT.read_text()
    HANDOUT.write_text(update(text, render(json.loads(RESULTS.read_text()))))
    print(f"updated {HANDOUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

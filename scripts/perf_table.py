"""Regenerate every performance figure students read from bench/results.json, the one measured
table: the handout's table (student/README.md, section 7), its estimate of what a GPU does on
the largest case (section 1), and the skeleton's per-version times (student/submission.cu).

The figures are measured, never typed: `make bench` runs the benchmark on the course GPU and then
this script. Rows: the baselines a student is compared with (not the hidden solution), and the
skeleton's stages as the bundled examples implement them (timed on the largest case only).

    python scripts/perf_table.py           # rewrite the three places
    python scripts/perf_table.py --check   # exit 1 if any of them differs from the table
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results.json"
HANDOUT = ROOT / "student" / "README.md"
SKELETON = ROOT / "student" / "submission.cu"
# The skeleton's stages, as bench/bench.py names the rows it times for them.
STAGES = {"naive": "stage 1: naive (examples/naive_cuda)",
          "tiled": "stage 2: tiled (examples/tiled_cuda)"}
ROWS = ["PyTorch reference", "SDPA FLASH", "SDPA cuDNN", *STAGES.values()]
NOT_MEASURED = "not measured yet (make bench)"


class Region:
    """Text between two markers of a file, regenerated whole."""

    def __init__(self, begin: str, end: str):
        self.begin, self.end = re.compile(begin), end

    def replace(self, text: str, body: str, where: Path) -> str:
        m = self.begin.search(text)
        end = text.find(self.end, m.end()) if m else -1
        if m is None or end < 0:
            raise SystemExit(f"{where}: the markers {self.begin.pattern!r} ... {self.end!r} are missing")
        return text[:m.end()] + body + text[end:]


TABLE = Region(r"<!-- perf-table:begin[^>]*-->", "<!-- perf-table:end -->")
ESTIMATE = Region(r"<!-- perf:largest-case[^>]*-->", "<!-- /perf -->")
VERSIONS = Region(r"// perf:begin[^\n]*\n", "// perf:end")


def largest_case(results: dict) -> str:
    return max({f["case"] for f in results["figures"]},
               key=lambda c: [int(x) for x in re.findall(r"\d+", c)][2])   # by seq_len


def figure(results: dict, row: str, case: str) -> dict | None:
    return next((f for f in results["figures"] if f["row"] == row and f["case"] == case), None)


def render_table(results: dict) -> str:
    cases = list(dict.fromkeys(f["case"] for f in results["figures"]))
    head = "| | " + " | ".join(f"`{c}`" for c in cases) + " |"
    lines = [f"Measured on an {results['device']} (driver {results['driver']}, torch "
             f"{results['torch']}, CUDA {results['cuda']}) on {results['date']}: median ms "
             f"(TFLOP/s). The stages are the bundled examples of the skeleton's versions 1 and 2, "
             f"timed on the largest case only.", "", head, "|---" * (len(cases) + 1) + "|"]
    for row in ROWS:
        cells = []
        for c in cases:
            f = figure(results, row, c)
            cells.append(f"{f['median_ms']:.3f} ms ({f['tflops']:.0f})" if f else
                         "-" if row in STAGES.values() and c != largest_case(results) else "n/a")
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n" + "\n".join(lines) + "\n"


def ms(results: dict, row: str, case: str) -> str:
    f = figure(results, row, case)
    if f is None:
        return NOT_MEASURED
    return f"~{f['median_ms']:.0f} ms" if f["median_ms"] >= 10 else f"~{f['median_ms']:.1f} ms"


def render_estimate(results: dict) -> str:
    f = figure(results, "SDPA cuDNN", largest_case(results))
    if f is None:
        return f"A modern GPU does that in a few tens of ms on its tensor cores ({NOT_MEASURED})"
    return (f"SDPA's cuDNN kernel does that in {f['median_ms']:.1f} ms on the course GPU's tensor "
            f"cores (section 7)")


def render_versions(results: dict) -> str:
    case = largest_case(results)
    t = {name: ms(results, row, case) for name, row in STAGES.items()}
    return (f"// Versions (KERNEL_VERSION below picks the one that runs). Times: the largest public case,\n"
            f"// `{case}`, on the course's {results['device']} ({results['date']}; README.md, section 7):\n"
            f"//   1  naive: one warp per query row, K and V streamed from global memory,\n"
            f"//      online softmax: {t['naive']}. (TODO 1.x)\n"
            f"//   2  tiled: K/V tiles in shared memory, shared by the rows of a block,\n"
            f"//      online softmax with rescaling, masked tails: {t['tiled']}. (TODO 2.x)\n"
            f"//      Still CUDA cores only: faster than version 1, slower than PyTorch's\n"
            f"//      matmul-softmax-matmul ({ms(results, 'PyTorch reference', case)}), which runs its matmuls on\n"
            f"//      tensor cores.\n"
            f"//   3  optional, tensor cores: the two matmuls on mma.sync / wmma, fp16 inputs, fp32\n"
            f"//      accumulation: SDPA FLASH's {ms(results, 'SDPA FLASH', case)} is reachable. (TODO 3.x)\n")


def regenerate(results: dict) -> dict[Path, str]:
    """Each file's text with its generated regions rewritten from `results`."""
    handout = HANDOUT.read_text()
    handout = TABLE.replace(handout, render_table(results), HANDOUT)
    handout = ESTIMATE.replace(handout, render_estimate(results), HANDOUT)
    skeleton = VERSIONS.replace(SKELETON.read_text(), render_versions(results), SKELETON)
    return {HANDOUT: handout, SKELETON: skeleton}


def main(argv: list[str]) -> int:
    if not RESULTS.exists():
        print(f"{RESULTS} does not exist: run `make bench` on the GPU machine first", file=sys.stderr)
        return 2
    texts = regenerate(json.loads(RESULTS.read_text()))
    if "--check" in argv:
        stale = [str(p.relative_to(ROOT)) for p, text in texts.items() if p.read_text() != text]
        if stale:
            print(f"performance figures differ from {RESULTS.relative_to(ROOT)} in: "
                  f"{', '.join(stale)}; run python scripts/perf_table.py", file=sys.stderr)
            return 1
        return 0
    for path, text in texts.items():
        if path.read_text() != text:
            path.write_text(text)
            print(f"updated {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Compare a graded adversarial run (make adversarial) with the GPU verdicts it must give:
every attack's (expected.json), every bundled example's graded beside them
(examples/expected.json; the Makefile's ADVERSARIAL_EXAMPLES) and the reference solution's (pass).

    python tests/adversarial/verdicts.py results-adversarial

One line per submission: ok or BAD, its verdict, the verdicts it may have, its median; then
'BAD N'. Exit 1 when any is BAD, or an attack or the solution is missing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXPECTED = {k: v for k, v in json.loads((HERE / "expected.json").read_text()).items()
            if not k.startswith("_")}
EXAMPLES = {k: v for k, v in json.loads((HERE.parent.parent / "examples" / "expected.json").read_text()).items()
            if not k.startswith("_")}


def rows(results: Path) -> list[tuple[str, Path, dict]]:
    """(name, result file, what it must get on a GPU): every attack and the solution (missing is
    BAD), and the examples that were graded."""
    out = [(name, results / f"{name}.json", want) for name, want in EXPECTED.items()]
    out += [(name, results / f"{name}.json", dict(gpu=[want["gpu"]])) for name, want in EXAMPLES.items()
            if (results / f"{name}.json").exists()]
    out.append(("solution (reference row)", results / "baselines" / "solution.json", dict(gpu=["pass"])))
    return out


def gpu_finding(result: dict, want: dict, logs: Path) -> str | None:
    """What is wrong with a GPU run's result against its expectation, or None: the verdict, and
    for a submission whose defence shows in what it printed, its stage logs (gpu_logs: text each
    logs/<name>.<stage>.log must contain)."""
    if result["status"] not in want["gpu"]:
        return f"got {result['status']}"
    for stage, text in want.get("gpu_logs", {}).items():
        log = logs / f"{result['id']}.{stage}.log"
        if not log.exists() or text not in log.read_text(errors="replace"):
            return f"its {stage} log does not say {text!r}"
    return None


def main(argv: list[str]) -> int:
    results = Path(argv[0]) if argv else Path("results-adversarial")
    bad = 0
    for name, path, want in rows(results):
        if not path.exists():
            print(f"BAD {name:28} missing")
            bad += 1
            continue
        got = json.loads(path.read_text())
        median = (got.get("timing") or {}).get("median_ms")
        finding = gpu_finding(got, want, results / "logs")
        bad += finding is not None
        print(f"{'ok ' if finding is None else 'BAD'} {name:28} {got['status']:16} want {'|'.join(want['gpu']):22}"
              f" {'' if median is None else f'{median:.3f} ms'}{'' if finding is None else '  ' + finding}")
    print(f"BAD {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Compare a graded adversarial run (make adversarial) with the GPU verdicts it must give:
every attack's (expected.json), every bundled example's graded beside them
(examples/expected.json; the Makefile's ADVERSARIAL_EXAMPLES), the honest corpus's (tests/corpus:
pass) and the reference solution's (pass),
and where expected.json names an honest twin, the median it must have against the twin's.

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
# The honest corpus (tests/corpus, issue 30): every one must pass, never go to review or be flagged.
CORPUS = sorted(p.name for p in (HERE.parent / "corpus").iterdir() if p.is_dir())


def rows(results: Path) -> list[tuple[str, Path, dict]]:
    """(name, result file, what it must get on a GPU): every attack and the solution (missing is
    BAD), and the examples that were graded."""
    out = [(name, results / f"{name}.json", want) for name, want in EXPECTED.items()]
    out += [(name, results / f"{name}.json", dict(gpu=[want["gpu"]])) for name, want in EXAMPLES.items()
            if (results / f"{name}.json").exists()]
    out += [(name, results / f"{name}.json", dict(gpu=["pass"])) for name in CORPUS
            if (results / f"{name}.json").exists()]
    out.append(("solution (reference row)", results / "baselines" / "solution.json", dict(gpu=["pass"])))
    return out


# A row's median against its honest twin's, graded in the same run (expected.json names the twin):
# the rule each key sets on mine / theirs, and what a row that breaks it is not. same_time_as: a
# trick the design makes useless is timed as its twin; not_faster_than: a trick meant to buy time
# buys none (slower is fine), within 2%, twice the < 1% that two gradings of one kernel differ by
# (make timing-trust).
TWIN_RULES = {
    "same_time_as": (lambda ratio: abs(ratio - 1) < 0.05, "within 5% of it"),
    "not_faster_than": (lambda ratio: ratio >= 0.98, "at least 0.98 x it: more than 2% faster"),
}


def median(result: dict) -> float | None:
    return (result.get("timing") or {}).get("median_ms")


def gpu_finding(result: dict, want: dict, logs: Path, medians: dict | None = None) -> str | None:
    """What is wrong with a GPU run's result against its expectation, or None: the verdict, for
    a submission whose defence shows in what it printed, its stage logs (gpu_logs: text each
    logs/<name>.<stage>.log must contain), and for one with an honest twin, its median against
    the twin's in `medians` (row name: median, the same run; TWIN_RULES)."""
    if result["status"] not in want["gpu"]:
        return f"got {result['status']}"
    for stage, text in want.get("gpu_logs", {}).items():
        log = logs / f"{result['id']}.{stage}.log"
        if not log.exists() or text not in log.read_text(errors="replace"):
            return f"its {stage} log does not say {text!r}"
    for key, (holds, bound) in TWIN_RULES.items():
        twin = want.get(key)
        if twin is None:
            continue
        mine, theirs = median(result), (medians or {}).get(twin)
        if not mine or not theirs:
            return f"{key} {twin}: no median to compare ({result['id']} {mine}, {twin} {theirs})"
        if not holds(mine / theirs):
            return (f"{key} {twin}: {result['id']} {mine:.3f} ms is {mine / theirs:.3f} x {twin}'s "
                    f"{theirs:.3f} ms, not {bound}")
    return None


def main(argv: list[str]) -> int:
    results = Path(argv[0]) if argv else Path("results-adversarial")
    graded = [(name, json.loads(path.read_text()) if path.exists() else None, want)
              for name, path, want in rows(results)]
    medians = {name: median(got) for name, got, _ in graded if got is not None}
    bad = 0
    for name, got, want in graded:
        if got is None:
            print(f"BAD {name:28} missing")
            bad += 1
            continue
        finding = gpu_finding(got, want, results / "logs", medians)
        bad += finding is not None
        print(f"{'ok ' if finding is None else 'BAD'} {name:28} {got['status']:16} want {'|'.join(want['gpu']):22}"
              f" {'' if medians[name] is None else f'{medians[name]:.3f} ms'}{'' if finding is None else '  ' + finding}")
    print(f"BAD {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

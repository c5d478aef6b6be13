"""Compare a graded adversarial run (make adversarial) with expected.json's GPU verdicts.

    python tests/adversarial/verdicts.py results-adversarial

One line per submission: ok or BAD, its verdict, the verdicts it may have, its median; then
'BAD N'. Exit 1 when any is BAD or missing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXPECTED = {k: v for k, v in json.loads((HERE / "expected.json").read_text()).items()
            if not k.startswith("_")}


def main(argv: list[str]) -> int:
    results = Path(argv[0]) if argv else Path("results-adversarial")
    bad = 0
    for name, want in EXPECTED.items():
        path = results / f"{name}.json"
        if not path.exists():
            print(f"BAD {name:28} missing")
            bad += 1
            continue
        got = json.loads(path.read_text())
        median = (got.get("timing") or {}).get("median_ms")
        ok = got["status"] in want["gpu"]
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} {name:28} {got['status']:16} want {'|'.join(want['gpu']):22}"
              f" {'' if median is None else f'{median:.3f} ms'}")
    print(f"BAD {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

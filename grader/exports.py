"""Grade exports: grades.csv, Gradescope's results.json per submission, Markdown feedback.

Gradescope's autograder format: a results.json with `score`, `tests` (name, score, max_score,
output, visibility) and `leaderboard` entries (name, value, order). Hidden cases are visible to
the student only once grades are published.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import TYPE_CHECKING

from .feedback import feedback_markdown
from .policy import Policy
from .results import write_json_atomic
from .status import Status

if TYPE_CHECKING:
    from .report import Row

GRADES_COLUMNS = ["submission", "status", "public_passed", "public_total", "hidden_passed",
                  "hidden_total", "median_ms", "tflops", "speedup_vs_reference", "rank",
                  "correctness_points", "performance_points", "score", "max_score", "message"]


def write_exports(out_dir: Path, rows: list["Row"], run: dict, policy: Policy) -> dict[str, Path]:
    students = [row for row in rows if row.result.role == "student"]
    grades = out_dir / "grades.csv"
    tmp = grades.with_name(".grades.csv.tmp")
    tmp.write_text(grades_csv(students, run))
    tmp.replace(grades)
    for row in students:
        write_json_atomic(out_dir / "gradescope" / row.result.id / "results.json",
                          gradescope_results(row, run, policy))
        feedback = out_dir / "feedback" / f"{row.result.id}.md"
        feedback.parent.mkdir(parents=True, exist_ok=True)
        feedback.write_text(feedback_markdown(row.result, score=row.score, rank=row.rank))
    return dict(grades=grades, gradescope=out_dir / "gradescope", feedback=out_dir / "feedback")


def _counts(row: "Row", run: dict) -> dict[str, int]:
    hidden = {c["id"]: c["hidden"] for c in run["cases"]}
    passed = {c.case for c in row.result.cases if c.status is Status.PASS}
    return dict(public_passed=sum(1 for c, h in hidden.items() if not h and c in passed),
                public_total=sum(1 for h in hidden.values() if not h),
                hidden_passed=sum(1 for c, h in hidden.items() if h and c in passed),
                hidden_total=sum(1 for h in hidden.values() if h))


def grades_csv(rows: list["Row"], run: dict) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=GRADES_COLUMNS)
    w.writeheader()
    for row in rows:
        r, t, s = row.result, row.result.timing, row.score
        w.writerow(dict(
            submission=r.id, status=r.status.value, **_counts(row, run),
            median_ms=f"{t.median_ms:.4f}" if t else "", tflops=f"{t.tflops:.2f}" if t else "",
            speedup_vs_reference=f"{row.speedup_vs_reference:.3f}" if row.speedup_vs_reference else "",
            rank=row.rank or "", correctness_points=s.correctness if s else "",
            performance_points=s.performance if s else "", score=s.total if s else "",
            max_score=s.max_total if s else "", message=r.message.splitlines()[0] if r.message else ""))
    return buf.getvalue()


def gradescope_results(row: "Row", run: dict, policy: Policy) -> dict:
    r = row.result
    by_case = {c.case: c for c in r.cases}
    tests = []
    for case in run["cases"]:
        c = by_case.get(case["id"])
        points = policy.hidden_case_points if case["hidden"] else policy.public_case_points
        status = c.status.value if c else "not_run"
        output = c.message if c and c.message else status
        if r.build and r.build.status is not Status.PASS:
            status, output = r.build.status.value, r.build.message
        tests.append(dict(name=f"{case['id']} ({'hidden' if case['hidden'] else 'public'})",
                          score=points if c and c.status is Status.PASS else 0, max_score=points,
                          status="passed" if c and c.status is Status.PASS else "failed",
                          output=f"{status}: {output}"[:8000],
                          visibility="after_published" if case["hidden"] else "visible"))
    score = row.score
    tests.append(dict(name="performance (largest public case)",
                      score=score.performance if score else 0, max_score=policy.performance_points,
                      output=score.performance_basis if score else "not timed", visibility="visible"))
    result = dict(score=score.total if score else sum(t["score"] for t in tests),
                  output=f"{r.status.value}: {r.message}"[:8000], visibility="visible",
                  stdout_visibility="hidden", tests=tests)
    if r.timing:
        result["leaderboard"] = [dict(name="median ms", value=round(r.timing.median_ms, 4), order="asc"),
                                 dict(name="TFLOP/s", value=round(r.timing.tflops, 2), order="desc")]
    return result

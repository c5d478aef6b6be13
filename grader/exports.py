"""Grade exports: grades.csv, LMS uploads, Gradescope's results.json per submission, feedback.

- `grades.csv` (instructors): one row per student, the roster's columns first when there is one,
  numbers in one format per column, UTF-8 with a BOM (so Excel reads names right).
- `canvas.csv`: Canvas's gradebook import format (Student, ID, SIS User ID, SIS Login ID,
  Section, then the assignment's column, and a "Points Possible" row); needs a roster.
- `gradescope_scores.csv`: Gradescope's score upload (Name, SID, Email, Score); needs a roster.
- `gradescope/<id>/results.json`: Gradescope's autograder format. Hidden cases are tests with
  `visibility: after_published`, so Gradescope hides them and the total score until grades are
  published; the always-visible top-level `output` speaks of the public cases and the build only.
- `feedback/<id>.md`: what the student sees, with their pseudonym.

Everything a student sees is rendered from `Redactor.student_result` (grader/privacy.py).
"""

from __future__ import annotations

import csv
import io
import re
import os
from pathlib import Path
from typing import TYPE_CHECKING

from .feedback import feedback_markdown
from .policy import Policy
from .privacy import Redactor
from .results import write_json_atomic
from .roster import Joined, Roster, join
from .status import Status

if TYPE_CHECKING:
    from .report import Row

GRADES_COLUMNS = ["submission", "pseudonym", "status", "public_passed", "public_total",
                  "hidden_passed", "hidden_total", "median_ms", "tflops", "speedup_vs_reference",
                  "rank", "correctness_points", "performance_points", "score", "max_score", "message"]
MISSING = "missing"               # the status of a roster student with no submission
CANVAS_IDENTITY = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
CANVAS_FROM_ROSTER = dict(zip(CANVAS_IDENTITY, ["name", "canvas_id", "sid", "login", "section"]))
GRADESCOPE_SCORE_COLUMNS = ["Name", "SID", "Email", "Score"]
# The gradebook column's title; Canvas matches "Title (assignment id)" exactly, a bare title by name.
CANVAS_ASSIGNMENT = os.environ.get("GRADER_CANVAS_ASSIGNMENT", "FlashAttention forward")


def write_exports(out_dir: Path, rows: list["Row"], run: dict, policy: Policy, *,
                  roster: Roster | None = None) -> dict[str, Path]:
    students = [row for row in rows if row.result.role == "student"]
    redactor = student_redactor(students, run, policy)
    joined = join(roster, students) if roster else None
    paths = dict(grades=out_dir / "grades.csv", gradescope=out_dir / "gradescope",
                 feedback=out_dir / "feedback")
    _write_text(paths["grades"], "\ufeff" + grades_csv(students, run, policy, joined=joined))
    if joined is not None:
        paths["canvas"] = out_dir / "canvas.csv"
        _write_text(paths["canvas"], "\ufeff" + canvas_csv(joined, policy.max_score(run["cases"])))
        paths["gradescope_scores"] = out_dir / "gradescope_scores.csv"
        _write_text(paths["gradescope_scores"], gradescope_scores_csv(joined))
    for row in students:
        shown = redactor.student_result(row.result)
        write_json_atomic(paths["gradescope"] / row.result.id / "results.json",
                          gradescope_results(row, run, policy, redactor=redactor))
        _write_text(paths["feedback"] / f"{row.result.id}.md",
                    feedback_markdown(shown, score=row.score, rank=row.rank,
                                      pseudonym=policy.pseudonym(row.result.id) if policy.pseudonyms else None))
    return paths


def student_redactor(students: list["Row"], run: dict, policy: Policy) -> Redactor:
    """The redactor of everything a student sees: real ids become pseudonyms where used."""
    names = {r.result.id: policy.pseudonym(r.result.id) for r in students} if policy.pseudonyms else {}
    return Redactor.for_run(run, names)


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8", newline="")
    tmp.replace(path)


def _counts(row: "Row", run: dict) -> dict[str, int]:
    hidden = {c["id"]: c["hidden"] for c in run["cases"]}
    passed = {c.case for c in row.result.cases if c.status is Status.PASS}
    return dict(public_passed=sum(1 for c, h in hidden.items() if not h and c in passed),
                public_total=sum(1 for h in hidden.values() if not h),
                hidden_passed=sum(1 for c, h in hidden.items() if h and c in passed),
                hidden_total=sum(1 for h in hidden.values() if h))


def fixed(value: float | None, digits: int) -> str:
    """One format per column: a fixed number of decimals, or empty."""
    return "" if value is None else f"{value:.{digits}f}"


def grade_fields(row: "Row", run: dict, policy: Policy) -> dict[str, object]:
    r, t, s = row.result, row.result.timing, row.score
    return dict(
        submission=r.id, pseudonym=policy.pseudonym(r.id) if policy.pseudonyms else "",
        status=r.status.value, **_counts(row, run),
        median_ms=fixed(t.median_ms if t else None, 4), tflops=fixed(t.tflops if t else None, 2),
        speedup_vs_reference=fixed(row.speedup_vs_reference, 3), rank=row.rank or "",
        correctness_points=fixed(s.correctness if s else None, 2),
        performance_points=fixed(s.performance if s else None, 2),
        score=fixed(s.total if s else None, 2),
        max_score=fixed(s.max_total if s else policy.max_score(run["cases"]), 2),
        message=r.message.splitlines()[0] if r.message else "")


def grades_csv(rows: list["Row"], run: dict, policy: Policy, *, joined: Joined | None = None) -> str:
    """One row per student. With a roster: its columns after `submission`, its students in its
    order (those with no submission as `missing`), then submissions not on the roster."""
    columns = GRADES_COLUMNS[:1] + list(joined.columns if joined else ()) + GRADES_COLUMNS[1:]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\r\n")
    w.writeheader()
    if joined is None:
        for row in rows:
            w.writerow(grade_fields(row, run, policy))
        return buf.getvalue()
    for student, row in joined.matched:
        base = grade_fields(row, run, policy) if row else dict(
            submission=student.folder, status=MISSING, message="no submission folder",
            max_score=fixed(policy.max_score(run["cases"]), 2))
        w.writerow({**base, **dict(student.fields)})
    for row in joined.extra:
        w.writerow({**grade_fields(row, run, policy), "message": "not on the roster: " + (
            row.result.message.splitlines()[0] if row.result.message else "")})
    return buf.getvalue()


def _score(row: "Row | None") -> str:
    return fixed(row.score.total, 2) if row is not None and row.score else ""


def canvas_csv(joined: Joined, points_possible: float) -> str:
    """Canvas's gradebook import: identity columns, one assignment column, a Points Possible row.
    Students with no submission get an empty cell (Canvas leaves their grade as it is)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\r\n")
    w.writerow(CANVAS_IDENTITY + [CANVAS_ASSIGNMENT])
    w.writerow(["Points Possible", "", "", "", "", fixed(points_possible, 2)])
    for student, row in joined.matched:
        w.writerow([student.get(CANVAS_FROM_ROSTER[c]) for c in CANVAS_IDENTITY] + [_score(row)])
    return buf.getvalue()


def gradescope_scores_csv(joined: Joined) -> str:
    """Gradescope's score upload: students matched by Email (or SID), one Score column."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\r\n")
    w.writerow(GRADESCOPE_SCORE_COLUMNS)
    for student, row in joined.matched:
        w.writerow([student.get("name"), student.get("sid"), student.get("email"), _score(row)])
    return buf.getvalue()


def _case_test(case: dict, c, points: float, redactor: Redactor, build_failed) -> dict:
    passed = c is not None and c.status is Status.PASS
    if build_failed is not None:
        output = f"{build_failed.status.value}: {redactor.text(build_failed.message)}"
    elif c is None:
        output = "not_run"
    else:
        output = f"{c.status.value}: {c.message}" if c.message else c.status.value
    if not case["hidden"]:   # a visible test never names a hidden case
        output = re.sub(r"(?:case )?hidden case \d+", "a hidden case", output)
    name = redactor.case_name(case["id"]) if case["hidden"] else f"public case {case['id']}"
    return dict(name=name, score=points if passed else 0, max_score=points,
                status="passed" if passed else "failed", output=output[:8000],
                visibility="after_published" if case["hidden"] else "visible")


def public_summary(row: "Row", run: dict, redactor: Redactor) -> str:
    """The always-visible top-level output: the build and the public cases only."""
    r = redactor.student_result(row.result)
    if r.build and r.build.status is not Status.PASS:
        return f"{r.build.status.value}: {r.build.message or r.message}"
    public = [c for c in row.result.cases if not c.hidden and not redactor.case(c.case)]
    passed = sum(c.status is Status.PASS for c in public)
    line = f"public cases: {passed} of {len(public)} pass"
    failed = next((c for c in public if c.status not in (Status.PASS, Status.NOT_RUN)), None)
    if failed is not None:
        line += f"; {failed.case}: {failed.status.value}"
    if row.result.status is Status.FLAGGED:
        line += f"\n{r.message}"
    if any(c["hidden"] for c in run["cases"]):
        line += ". Hidden cases, performance and the total are shown when grades are published."
    return line


def gradescope_results(row: "Row", run: dict, policy: Policy, *, redactor: Redactor | None = None) -> dict:
    redactor = redactor or Redactor.for_run(run)
    r = row.result
    shown = {c.case: c for c in redactor.student_result(r).cases}
    by_case = {c.case: shown[redactor.case_name(c.case)] for c in r.cases}
    build_failed = r.build if r.build and r.build.status is not Status.PASS else None
    any_hidden = any(c["hidden"] for c in run["cases"])
    tests = [_case_test(case, by_case.get(case["id"]), policy.hidden_case_points if case["hidden"]
                        else policy.public_case_points, redactor, build_failed) for case in run["cases"]]
    score = row.score
    tests.append(dict(name="performance (largest public case)",
                      score=score.performance if score else 0, max_score=policy.performance_points,
                      output=score.performance_basis if score else "not timed",
                      # given only when every case passes, hidden ones included
                      visibility="after_published" if any_hidden else "visible"))
    result = dict(score=score.total if score else sum(t["score"] for t in tests),
                  output=public_summary(row, run, redactor)[:8000], visibility="visible",
                  stdout_visibility="hidden", tests=tests)
    if r.timing:
        result["leaderboard"] = [dict(name="median ms", value=round(r.timing.median_ms, 4), order="asc"),
                                 dict(name="TFLOP/s", value=round(r.timing.tflops, 2), order="desc")]
    return result

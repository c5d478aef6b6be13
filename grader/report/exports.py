"""Grade exports: grades.csv, LMS uploads, Gradescope's results.json per submission, feedback.

- `grades.csv` (instructors): one row per student, the roster's columns first when there is one,
  numbers in one format per column, UTF-8 with a BOM (so Excel reads names right).
- `canvas.csv`: Canvas's gradebook import (needs a roster). The format is what Canvas's importer
  parses (https://github.com/instructure/canvas-lms/blob/master/lib/gradebook_importer.rb; a
  guide: https://teaching.resources.osu.edu/toolsets/carmencanvas/guides/calculating-final-grades/import-csv-file-carmen-grades):
  a header whose first columns are Student, ID, SIS User ID, SIS Login ID, Section, then one
  column per assignment titled "Title (assignment id)" (a bare title is matched by name, or makes
  a new assignment); a row whose first cell is "Points Possible"; then one row per student with a
  score, matched by ID (Canvas's user id), else SIS User ID, else SIS Login ID, else name.
  Students with no score have no row, since Canvas would clear their grade for an empty cell.
- `gradescope_scores.csv`: scores keyed the way Gradescope's roster CSV identifies students (Name
  and Email required, SID optional: https://help.gradescope.com/article/w59nl02vyt-instructor-course-add-members),
  one Score column; needs a roster.
- `gradescope/<id>/results.json`: Gradescope's autograder format
  (https://gradescope-autograders.readthedocs.io/en/latest/specs/). Hidden cases are tests with
  `visibility: after_published` ("shown only when the assignment is explicitly published"), and
  "if test cases are hidden, students will not be able to see their total score"; the
  always-visible top-level `output` speaks of the build and the public cases only, and names no
  hidden case. `leaderboard` entries (https://gradescope-autograders.readthedocs.io/en/latest/leaderboards/)
  exist only for a ranked submission (it passed every case and was timed, and does not wait for
  an instructor's review): like the status on the students' page, that says all hidden cases
  passed, and nothing about any one.
- `feedback/<id>.md`: the student's report, with their pseudonym, to post when grades are
  published: it lists hidden cases as "hidden case k" with their status.

A run that could not check correctness (no CUDA device, a calibration run) writes no grades:
not grades.csv, canvas.csv, gradescope_scores.csv or Gradescope results, and removes those of an
earlier run in the same folder; the paths it returns say why (`NotWritten`). A result whose status
is the machine's doing (`not_run`, `environment_error`) gets no score, never a 0: an empty cell
in grades.csv, no row in the LMS files, no results.json.

Everything a student sees is rendered from `Redactor.student_result` (grader/report/privacy.py). The
rows come with the instructors' review decisions applied (report.reported, grader/course/review.py): a
`review` result gets its correctness points and no performance points until it is cleared.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from grader.common.status import Status
from grader.course.policy import Policy
from grader.course.results import write_json_atomic
from grader.course.roster import Joined, Roster, join
from grader.report.feedback import feedback_markdown, review_summary
from grader.report.privacy import Redactor, unnumber
from grader.report.rows import why_no_grades

if TYPE_CHECKING:
    from grader.report.rows import Row

GRADES_COLUMNS = ["submission", "pseudonym", "status", "public_passed", "public_total",
                  "hidden_passed", "hidden_total", "median_ms", "tflops", "speedup_vs_reference",
                  "rank", "correctness_points", "performance_points", "score", "max_score", "message"]
MISSING = "missing"               # the status of a roster student with no submission
CANVAS_IDENTITY = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
CANVAS_FROM_ROSTER = dict(zip(CANVAS_IDENTITY, ["name", "canvas_id", "sid", "login", "section"]))
GRADESCOPE_SCORE_COLUMNS = ["Name", "SID", "Email", "Score"]
# The gradebook column's title; Canvas matches "Title (assignment id)" exactly, a bare title by name.
CANVAS_ASSIGNMENT = os.environ.get("GRADER_CANVAS_ASSIGNMENT", "FlashAttention forward")
GRADE_FILES = ("grades.csv", "canvas.csv", "gradescope_scores.csv", "gradescope")
VISIBLE_NAME = "another case"     # what Gradescope's always-visible text calls a hidden case


@dataclasses.dataclass(frozen=True)
class NotWritten:
    """Stands in the returned paths for an export this run did not write, and says why."""
    reason: str

    def __str__(self) -> str:
        return f"not written: {self.reason}"


def write_exports(out_dir: Path, rows: list["Row"], run: dict, policy: Policy, *,
                  roster: Roster | None = None) -> dict[str, Path | NotWritten]:
    """Write the exports of `rows`; returns what was written, and a `NotWritten` for each grade
    file that was not (and why). Files of another run that this one did not write are removed."""
    students = [row for row in rows if row.result.role == "student"]
    redactor = student_redactor(students, run, policy)
    joined = join(roster, students) if roster else None
    reason = why_no_grades(run)
    paths: dict[str, Path | NotWritten] = dict(feedback=out_dir / "feedback")
    for row in students:           # row.score is None where there is no score (report.build_rows)
        _write_text(out_dir / "feedback" / f"{row.result.id}.md",
                    feedback_markdown(redactor.student_result(row.result), score=row.score, rank=row.rank,
                                      pseudonym=policy.pseudonym(row.result.id) if policy.pseudonyms else None))
    _remove_stale(out_dir / "feedback", {f"{row.result.id}.md" for row in students})
    for name in GRADE_FILES:       # an earlier run's grades are not this run's
        _remove(out_dir / name)
    if reason is not None:
        skipped = NotWritten(reason)
        return dict(paths, grades=skipped, gradescope=skipped,
                    **({"canvas": skipped, "gradescope_scores": skipped} if joined else {}))
    paths.update(grades=out_dir / "grades.csv", gradescope=out_dir / "gradescope")
    _write_text(out_dir / "grades.csv", "\ufeff" + grades_csv(students, run, policy, joined=joined))
    if joined is not None:
        paths.update(canvas=out_dir / "canvas.csv", gradescope_scores=out_dir / "gradescope_scores.csv")
        _write_text(out_dir / "canvas.csv", "\ufeff" + canvas_csv(joined, policy.max_score(run["cases"])))
        _write_text(out_dir / "gradescope_scores.csv", gradescope_scores_csv(joined))
    for row in students:
        if row.score is not None:      # the others get run_autograder's "not graded yet"
            write_json_atomic(out_dir / "gradescope" / row.result.id / "results.json",
                              gradescope_results(row, run, policy, redactor=redactor))
    return paths


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _remove_stale(folder: Path, keep: set[str]) -> None:
    """Remove what an earlier run left in one of the grader's own per-student folders."""
    for entry in folder.iterdir() if folder.is_dir() else ():
        if entry.name not in keep:
            _remove(entry)


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
    """Canvas's gradebook import: identity columns, one assignment column, a Points Possible row,
    and a row for each roster student with a score. A student with none (no submission, or not
    scored) has no row: Canvas posts an empty cell as an empty grade, clearing the one they had
    (ui/features/gradebook_uploads/jquery/process_gradebook_upload.js), and leaves students
    who are not in the file alone."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\r\n")
    w.writerow(CANVAS_IDENTITY + [CANVAS_ASSIGNMENT])
    w.writerow(["Points Possible", "", "", "", "", fixed(points_possible, 2)])
    for student, row in joined.matched:
        if _score(row):
            w.writerow([student.get(CANVAS_FROM_ROSTER[c]) for c in CANVAS_IDENTITY] + [_score(row)])
    return buf.getvalue()


def gradescope_scores_csv(joined: Joined) -> str:
    """Scores for Gradescope: students identified by Email (or SID), one Score column; as in
    canvas_csv, only the roster students with a score."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\r\n")
    w.writerow(GRADESCOPE_SCORE_COLUMNS)
    for student, row in joined.matched:
        if _score(row):
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
    if not case["hidden"]:   # a visible test does not speak of hidden cases
        output = unnumber(output, VISIBLE_NAME)
    name = redactor.case_name(case["id"]) if case["hidden"] else f"public case {case['id']}"
    return dict(name=name, score=points if passed else 0, max_score=points,
                status="passed" if passed else "failed", output=output[:8000],
                visibility="after_published" if case["hidden"] else "visible")


def public_summary(row: "Row", run: dict, redactor: Redactor) -> str:
    """The always-visible top-level output: the build and the public cases only."""
    r = redactor.student_result(row.result)
    if r.build and r.build.status is not Status.PASS:
        return unnumber(f"{r.build.status.value}: {r.build.message or r.message}", VISIBLE_NAME)
    public = [c for c in row.result.cases if not c.hidden and not redactor.case(c.case)]
    passed = sum(c.status is Status.PASS for c in public)
    line = f"public cases: {passed} of {len(public)} pass"
    failed = next((c for c in public if c.status not in (Status.PASS, Status.NOT_RUN)), None)
    if failed is not None:
        line += f"; {failed.case}: {failed.status.value}"
    if row.result.status is Status.FLAGGED:
        line += f"\n{unnumber(r.message, VISIBLE_NAME)}"
    if row.result.status is Status.REVIEW:   # its own lines, and that it is not a verdict
        line += f"\n{unnumber(review_summary(r).rstrip('.'), VISIBLE_NAME)}"
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
    if r.ranked:   # a time that waits for review, or was flagged, is on no leaderboard
        result["leaderboard"] = [dict(name="median ms", value=round(r.timing.median_ms, 4), order="asc"),
                                 dict(name="TFLOP/s", value=round(r.timing.tflops, 2), order="desc")]
    return result

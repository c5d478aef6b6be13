"""The LMS exports against their formats: Canvas's gradebook import, Gradescope's score upload,
Gradescope's autograder results.json, and the run_autograder that reports them on Gradescope;
and a run that could not check correctness, which writes no grades.

Canvas's rules are those of its importer (instructure/canvas-lms, lib/gradebook_importer.rb);
Gradescope's those of https://gradescope-autograders.readthedocs.io/en/latest/specs/."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from grader.report import exports
from grader.report.exports import CANVAS_ASSIGNMENT, CANVAS_IDENTITY, GRADESCOPE_SCORE_COLUMNS, NotWritten
from grader.report.gradescope import bundle, problems
from grader.report.gradescope import main as gradescope_main
from grader.course.policy import Policy
from grader.report.pages import RUN_FILE, write_reports
from grader.course.results import read_results, write_result
from grader.common.status import Status

from .test_roster import write_roster

FIXTURES = Path(__file__).parent / "fixtures" / "gpu_run"
POLICY = Policy(pseudonym_salt="exports-test")


@pytest.fixture
def exported(tmp_path) -> tuple[Path, dict[str, Path], Path]:
    out = tmp_path / "results"
    shutil.copytree(FIXTURES, out)
    roster = write_roster(tmp_path)
    return out, write_reports(out, policy=POLICY, roster=roster), roster


def read_csv(path: Path) -> list[list[str]]:
    return list(csv.reader(io.StringIO(path.read_bytes().decode("utf-8-sig"), newline="")))


def test_canvas_gradebook_import_format(exported):
    _, paths, _ = exported
    rows = read_csv(paths["canvas"])
    header, points, students = rows[0], rows[1], rows[2:]
    # Canvas: the five identity columns in this order, then one column per assignment
    assert header == CANVAS_IDENTITY + [CANVAS_ASSIGNMENT]
    assert points[0] == "Points Possible" and float(points[-1]) == 90.0
    assert all(len(r) == len(header) for r in rows)
    assert [r[:3] for r in students] == [["José García", "9001", "001234"], ["Lee, Bo", "9002", "005678"]]
    assert [r[4] for r in students] == ["A", "B"]
    # ghost has no submission: no row, since Canvas would clear their grade for an empty cell
    assert [r[-1] for r in students] == ["90.00", "0.00"]


def canvas_import(text: str) -> dict:
    """What Canvas's gradebook importer makes of a CSV (lib/gradebook_importer.rb, the parts
    that decide whether a file imports): the header's student columns, the assignments as
    (title, id), the points possible, and each student's key and grade cells. Raises
    AssertionError where Canvas would reject the file or misread it."""
    rows = list(csv.reader(io.StringIO(text.removeprefix("\ufeff"), newline="")))
    header = rows[0]
    # row_has_student_headers?: Student, then ID
    assert len(header) > 3 and "Student" in header[0] and "ID" in header[1], header
    # update_column_count: name and id, then SIS User ID and SIS Login ID, then Section
    student_columns = 3
    if re.search(r"SIS\s+User\s+ID", header[2]) and re.search(r"SIS\s+Login\s+ID", header[3]):
        student_columns += 2
    assert "Section" in header[student_columns - 1], f"{header[student_columns - 1]!r} is not Section"
    assignments = [re.fullmatch(r"(.*)\s\((\d+)\)", h).groups() if re.fullmatch(r"(.*)\s\((\d+)\)", h)
                   else (h, None) for h in header[student_columns:]]
    assert assignments, "no assignment column"
    # identify_delimiter: the first lines must split into the same number of fields
    assert len({len(r) for r in rows}) == 1, "rows of different lengths"
    points = rows[1]
    assert "Points Possible" in points[0]
    students = []
    for row in rows[2:]:
        assert row[1] or row[2] or row[3] or row[0], f"a row Canvas cannot match to anyone: {row}"
        grades = row[student_columns:]
        for g in grades:    # a number; an empty cell would clear the student's grade in Canvas
            assert re.fullmatch(r"-?\d+(\.\d+)?", g), f"grade {g!r} is not a number"
        students.append(dict(name=row[0], id=row[1], sis_user_id=row[2], sis_login_id=row[3],
                             section=row[4], grades=grades))
    return dict(assignments=assignments, points=[float(p) for p in points[student_columns:]],
                students=students)


def test_canvas_file_imports_as_canvas_reads_it(exported, monkeypatch):
    out, paths, roster = exported
    got = canvas_import(paths["canvas"].read_text(encoding="utf-8"))
    assert got["assignments"] == [("FlashAttention forward", None)]   # matched by title
    assert got["points"] == [90.0]
    assert [s["id"] for s in got["students"]] == ["9001", "9002"]   # Canvas user ids first
    # with the assignment's id in its title, Canvas matches the column to that assignment exactly
    monkeypatch.setattr(exports, "CANVAS_ASSIGNMENT", "FlashAttention forward (4242)")
    paths = write_reports(out, policy=POLICY, roster=roster)
    assert canvas_import(paths["canvas"].read_text(encoding="utf-8"))["assignments"] == [
        ("FlashAttention forward", "4242")]


def test_the_canvas_check_catches_what_canvas_rejects():
    good = "Student,ID,SIS User ID,SIS Login ID,Section,A\nPoints Possible,,,,,90\nAna,1,2,a,S,9.5\n"
    assert canvas_import(good)["students"][0]["grades"] == ["9.5"]
    for bad in (good.replace("Student,ID", "Name,ID"), good.replace(",Section,", ",Group,"),
                good.replace("Points Possible", "Max"), good.replace("9.5", "9.5 pts"),
                good.replace("S,9.5", "S,"), good.replace("S,9.5", "S,9.5,1")):
        with pytest.raises(AssertionError):
            canvas_import(bad)


def test_gradescope_score_upload_format(exported):
    _, paths, _ = exported
    rows = read_csv(paths["gradescope_scores"])
    assert rows[0] == GRADESCOPE_SCORE_COLUMNS
    for name, sid, email, score in rows[1:]:
        assert "@" in email and sid                       # Gradescope matches on email or SID
        assert 0 <= float(score) <= 90
    assert rows[1:] == [["José García", "001234", "ana@uni.edu", "90.00"],
                        ["Lee, Bo", "005678", "bo@uni.edu", "0.00"]]    # ghost: no submission


def test_every_results_json_follows_gradescopes_format(exported):
    out, _, _ = exported
    docs = sorted((out / "gradescope").glob("*/results.json"))
    assert len(docs) == 7
    for path in docs:
        doc = json.loads(path.read_text())
        assert problems(doc) == [], path
        assert doc["score"] == pytest.approx(sum(t["score"] for t in doc["tests"]))


def test_the_format_check_catches_what_gradescope_rejects():
    good = dict(score=1.0, tests=[dict(name="a", score=1, max_score=1, visibility="visible")])
    assert problems(good) == []
    assert problems(dict(good, visibility="students")) == [
        "visibility 'students' is not one of ['after_due_date', 'after_published', 'hidden', 'visible']"]
    assert problems(dict(tests=[dict(name="a")])) == ["no top-level score and not every test has one"]
    assert problems(dict(good, score=float("nan")))[0].startswith("score nan is not a finite number")
    assert problems(dict(good, leaderboard=[dict(name="t", value=1, order="up")])) == [
        "leaderboard[0].order 'up' is not 'asc' or 'desc'"]
    assert problems(dict(good, verdict="x")) == ["unknown top-level key 'verdict'"]


def run_autograder(root: Path) -> subprocess.CompletedProcess:
    script = root / "source" / "run_autograder"
    return subprocess.run([sys.executable, str(script)], env={**os.environ, "AUTOGRADER_ROOT": str(root)},
                          capture_output=True, text=True, timeout=120)


def gradescope_container(tmp_path: Path, zip_path: Path, users: list[dict]) -> Path:
    """/autograder as Gradescope lays it out: source/ (the zip), submission_metadata.json."""
    root = tmp_path / "autograder"
    with zipfile.ZipFile(zip_path) as z:
        z.extractall(root / "source")
    (root / "submission").mkdir()
    (root / "submission_metadata.json").write_text(json.dumps(dict(
        id=1, created_at="2026-11-22T10:00:00.000000-08:00", users=users,
        assignment=dict(id=7, title="FlashAttention", total_points="90.0"))))
    return root


def test_run_autograder_reports_the_gpu_machines_results(exported, tmp_path):
    out, _, roster = exported
    zip_path, missing = bundle(out, roster, tmp_path / "autograder.zip")
    assert missing == ["ghost"]
    names = zipfile.ZipFile(zip_path).namelist()
    assert {"run_autograder", "setup.sh", "index.json", "results/triton_flash/results.json"} <= set(names)
    assert not any("naive_cuda" in n for n in names)            # not on the roster: not packed

    root = gradescope_container(tmp_path, zip_path, [dict(email="ANA@uni.edu", name="José", sid=None)])
    proc = run_autograder(root)
    assert proc.returncode == 0, proc.stderr
    reported = json.loads((root / "results" / "results.json").read_text())
    assert reported == json.loads((out / "gradescope" / "triton_flash" / "results.json").read_text())
    assert problems(reported) == []


def test_run_autograder_says_when_there_are_no_results(exported, tmp_path):
    out, _, roster = exported
    zip_path, _ = bundle(out, roster, tmp_path / "autograder.zip")
    root = gradescope_container(tmp_path, zip_path, [dict(email="gh@uni.edu", name="Zoë", sid="009999")])
    assert run_autograder(root).returncode == 0
    reported = json.loads((root / "results" / "results.json").read_text())
    assert problems(reported) == [] and reported["score"] == 0
    assert "graded on the course's GPU machine" in reported["output"]


def test_bundle_command(exported, tmp_path, capsys):
    out, _, roster = exported
    assert gradescope_main([str(out), "--roster", str(roster)]) == 0
    assert (out / "gradescope_autograder.zip").exists()
    assert "no results for 1 roster folder(s): ghost" in capsys.readouterr().out
    assert gradescope_main([str(tmp_path), "--roster", str(roster)]) == 2


def _graded_run(tmp_path: Path, **run_changes) -> Path:
    out = tmp_path / "results"
    shutil.copytree(FIXTURES, out)
    run = json.loads((out / RUN_FILE).read_text())
    for key, value in run_changes.items():
        run = dict(run, device=dict(run["device"], **value)) if key == "device" else dict(run, **{key: value})
    (out / RUN_FILE).write_text(json.dumps(run))
    return out


@pytest.mark.parametrize("change, why", [
    (dict(device=dict(cuda=False, name="cpu")), "no CUDA device on the grading machine"),
    (dict(calibration=True), "a calibration run"),
])
def test_a_run_that_could_not_check_correctness_writes_no_grades(tmp_path, capsys, change, why):
    out = _graded_run(tmp_path, **change)
    gpu_run = _graded_run(tmp_path / "gpu")
    write_reports(gpu_run, policy=POLICY, roster=write_roster(tmp_path))
    shutil.copytree(gpu_run / "gradescope", out / "gradescope")          # its files are left there
    for name in ("grades.csv", "canvas.csv", "gradescope_scores.csv"):
        shutil.copyfile(gpu_run / name, out / name)
    paths = write_reports(out, policy=POLICY, roster=write_roster(tmp_path))
    for key in ("grades", "canvas", "gradescope_scores", "gradescope"):
        assert isinstance(paths[key], NotWritten) and why in str(paths[key]), key
    assert str(paths["grades"]).startswith("not written: ")          # the terminal's line
    for name in ("grades.csv", "canvas.csv", "gradescope_scores.csv", "gradescope"):
        assert not (out / name).exists(), f"{name} of an earlier run is still there"
    assert gradescope_main([str(out), "--roster", str(write_roster(tmp_path))]) == 2
    assert f"that run wrote no grades: {why}" in capsys.readouterr().err
    feedback = sorted((out / "feedback").glob("*.md"))
    assert len(feedback) == 7 and not any("**Score:**" in f.read_text() for f in feedback)
    page = paths["leaderboard"].read_text()
    assert f"No scores: {why}" in page and " / 90<" not in page
    students = paths["students"].read_text()
    assert "No scores: this run could not check correctness" in students and " / 90<" not in students
    assert students.count(">not scored<") == 7


@pytest.mark.parametrize("status", [Status.NOT_RUN, Status.ENVIRONMENT_ERROR])
def test_a_result_the_machine_could_not_grade_gets_no_score_not_a_zero(tmp_path, status):
    out = _graded_run(tmp_path)
    r = next(r for r in read_results(out) if r.id == "triton_flash")
    write_result(out, dataclasses.replace(
        r, status=status, timing=None, message=f"{status.value}: the machine's doing",
        cases=tuple(dataclasses.replace(c, status=Status.NOT_RUN, finding=None) for c in r.cases)))
    paths = write_reports(out, policy=POLICY, roster=write_roster(tmp_path))
    grades = {row["submission"]: row for row in csv.DictReader(
        io.StringIO(paths["grades"].read_text(encoding="utf-8-sig")))}
    assert grades["triton_flash"]["status"] == status.value and grades["triton_flash"]["score"] == ""
    assert grades["skeleton"]["score"] == "0.00"                         # a student's 0 stays a 0
    canvas = canvas_import(paths["canvas"].read_text(encoding="utf-8"))
    assert [s["id"] for s in canvas["students"]] == ["9002"]           # Canvas keeps what 9001 had
    assert [r[0] for r in read_csv(paths["gradescope_scores"])[1:]] == ["Lee, Bo"]
    assert not (out / "gradescope" / "triton_flash").exists()           # "not graded yet" there
    assert (out / "gradescope" / "skeleton" / "results.json").exists()
    assert "**Score:**" not in (out / "feedback" / "triton_flash.md").read_text()
    assert paths["leaderboard"].read_text().count(">not scored<") == 1

"""The LMS exports against their formats: Canvas's gradebook import, Gradescope's score upload,
Gradescope's autograder results.json, and the run_autograder that reports them on Gradescope."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from grader.exports import CANVAS_ASSIGNMENT, CANVAS_IDENTITY, GRADESCOPE_SCORE_COLUMNS
from grader.gradescope import bundle, problems
from grader.gradescope import main as gradescope_main
from grader.policy import Policy
from grader.report import write_reports

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
    assert [r[:3] for r in students] == [["José García", "9001", "001234"], ["Lee, Bo", "9002", "005678"],
                                         ["Zoë Ghost", "9003", "009999"]]
    assert [r[4] for r in students] == ["A", "B", "A"]
    assert [r[-1] for r in students] == ["90.00", "0.00", ""]   # no submission: left as it is


def test_gradescope_score_upload_format(exported):
    _, paths, _ = exported
    rows = read_csv(paths["gradescope_scores"])
    assert rows[0] == GRADESCOPE_SCORE_COLUMNS
    for name, sid, email, score in rows[1:]:
        assert "@" in email and sid                       # Gradescope matches on email or SID
        assert score == "" or 0 <= float(score) <= 90
    assert rows[1] == ["José García", "001234", "ana@uni.edu", "90.00"]


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

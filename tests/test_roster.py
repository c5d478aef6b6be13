"""The roster join: its columns kept as given, missing and extra students, clear errors."""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import pytest

from grader.course.policy import Policy
from grader.report.pages import RUN_FILE, text_table, write_reports
from grader.report.rows import build_rows
from grader.course.results import read_results
from grader.course.roster import RosterError, join, load_roster

FIXTURES = Path(__file__).parent / "fixtures" / "gpu_run"
POLICY = Policy(pseudonym_salt="roster-test")
ROSTER = ("folder,sid,email,name,canvas_id,section\n"
          "triton_flash,001234,ana@uni.edu,José García,9001,A\n"
          "skeleton,005678,bo@uni.edu,\"Lee, Bo\",9002,B\n"
          "ghost,009999,gh@uni.edu,Zoë Ghost,9003,A\n")


def write_roster(tmp_path: Path, text: str = ROSTER, *, bom: bool = True) -> Path:
    path = tmp_path / "roster.csv"
    path.write_bytes(("\ufeff" if bom else "").encode() + text.encode("utf-8"))
    return path


def test_roster_keeps_values_as_given(tmp_path):
    roster = load_roster(write_roster(tmp_path))
    assert roster.columns == ("sid", "email", "name", "canvas_id", "section")
    first = roster.students[0]
    assert first.folder == "triton_flash" and first.get("sid") == "001234"   # leading zeros kept
    assert roster.students[1].get("name") == "Lee, Bo"


@pytest.mark.parametrize("text, message", [
    ("sid,email\n1,a@b\n", r"roster.csv:1: no 'folder' column"),
    ("folder,sid\nx,1\nx,2\n", r"roster.csv:3: folder 'x' is also on line 2"),
    ("folder,sid\n,1\n", r"roster.csv:2: empty 'folder'"),
    ("folder,sid\nx,1,2\n", r"roster.csv:2: more values than columns"),
])
def test_malformed_rosters_name_the_line_and_the_fix(tmp_path, text, message):
    with pytest.raises(RosterError, match=message):
        load_roster(write_roster(tmp_path, text))


def test_a_roster_that_is_not_utf8_says_so(tmp_path):
    path = tmp_path / "roster.csv"
    path.write_bytes("folder,name\nx,Jos\xe9\n".encode("latin-1"))
    with pytest.raises(RosterError, match="not UTF-8.*CSV UTF-8"):
        load_roster(path)


def test_join_lists_missing_and_extra_students(tmp_path):
    roster = load_roster(write_roster(tmp_path))
    results = [r for r in read_results(FIXTURES) if r.role == "student"]
    joined = join(roster, results, key=lambda r: r.id)
    assert [s.folder for s in joined.missing] == ["ghost"]
    assert {r.id for r in joined.extra} == {r.id for r in results} - {"triton_flash", "skeleton"}
    assert [r.id if r else None for _, r in joined.matched] == ["triton_flash", "skeleton", None]


def test_grades_csv_carries_the_roster_with_a_bom(tmp_path):
    out = tmp_path / "results"
    shutil.copytree(FIXTURES, out)
    paths = write_reports(out, policy=POLICY, roster=write_roster(tmp_path))
    raw = paths["grades"].read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf") and "José García".encode() in raw   # Excel reads UTF-8
    rows = list(csv.DictReader(io.StringIO(raw.decode("utf-8-sig"))))
    assert list(rows[0])[:6] == ["submission", "sid", "email", "name", "canvas_id", "section"]
    by = {r["submission"]: r for r in rows}
    assert by["triton_flash"]["sid"] == "001234" and by["triton_flash"]["score"] == "90.00"
    assert by["ghost"]["status"] == "missing" and by["ghost"]["score"] == ""
    assert by["naive_cuda"]["message"].startswith("not on the roster") and by["naive_cuda"]["sid"] == ""
    assert [r["submission"] for r in rows][:3] == ["triton_flash", "skeleton", "ghost"]
    page = paths["leaderboard"].read_text()
    assert "Missing:</b> ghost (Zoë Ghost)" in page and "naive_cuda" in page
    students = paths["students"].read_text()
    assert "1 missing" in students and "ghost" not in students and "Zoë" not in students


def test_roster_option_on_the_command_line(tmp_path, capsys):
    from grader.cli.main import main
    out = tmp_path / "results"
    shutil.copytree(FIXTURES, out)
    bad = tmp_path / "bad.csv"
    bad.write_text("sid\n1\n")
    assert main(["leaderboard", "--out", str(out), "--roster", str(bad)]) == 2
    assert "no 'folder' column" in capsys.readouterr().err
    assert main(["leaderboard", "--out", str(out), "--roster", str(write_roster(tmp_path))]) == 0
    assert (out / "canvas.csv").exists() and (out / "gradescope_scores.csv").exists()
    run = json.loads((out / RUN_FILE).read_text())
    table = text_table(build_rows(read_results(out), run=run), missing=1)
    assert table.endswith("1 runtime_error · 2 mismatch · 3 pass · 1 missing")

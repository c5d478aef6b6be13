"""A grading run an instructor and a script can trust (issue 32): the exit status says whether
every entry has a final verdict (grader/report/summary.py), the summary after the table says what
is left to do and the command that does it, and a result file another grader version wrote is
shown as what could be read of it, with a note, never dropped or called missing."""

from __future__ import annotations

import csv
import dataclasses
import html
import io
import json
import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from grader.cli.main import main
from grader.common import config
from grader.common.status import Status
from grader.course.results import SCHEMA_VERSION, placeholder, read_result, read_results, write_result
from grader.report.pages import RUN_FILE, terminal_table, write_reports
from grader.report.rows import build_rows
from grader.report.summary import (EXIT_NOT_FINAL, EXIT_OK, exit_status, outcome_text, regrade_command,
                                   run_outcome)

from .test_report import POLICY, RUN, results, timing
from .test_results import sample

HIDDEN = "b1_h1_s1_d64"   # test_report.RUN's hidden case: its id and shape must never be printed


def env_error(id: str) -> object:
    return dataclasses.replace(sample(id, Status.ENVIRONMENT_ERROR),
                               message=f"case {HIDDEN}: the grading machine ran out of scratch space")


def test_exit_status_is_zero_only_when_every_entry_has_a_final_verdict(tmp_path):
    final = results()
    assert exit_status(0, final) == EXIT_OK == 0
    assert exit_status(0, final + [sample("rev", Status.REVIEW)]) == 0   # review: a verdict all the same
    assert exit_status(0, final + [sample("nr", Status.NOT_RUN)]) == 0   # no GPU: a verdict of its own
    assert exit_status(0, final + [env_error("bob")]) == EXIT_NOT_FINAL == 4
    lost = placeholder(dict(id="carl"), tmp_path / "carl.json", "no such file")
    assert exit_status(0, final + [lost]) == 4
    cudnn = dataclasses.replace(sample("sdpa_cudnn", Status.ENVIRONMENT_ERROR, role="baseline"))
    assert exit_status(0, final + [cudnn]) == 4   # a baseline is an entry of the run too
    assert exit_status(3, final + [env_error("bob")]) == 3       # GPU unhealthy: kept
    assert exit_status(130, final + [env_error("bob")]) == 130   # interrupted: kept


def test_the_regrade_command_is_the_runs_own_with_only_the_entries_left():
    command = ("python -m grader grade 'my drop.zip' --out res --only a b --force "
               "--roster r.csv --executor slurm --partition gpu")
    got = regrade_command(command, ["bob", "o'neil"], out_dir=Path("res"), python="/v/bin/python")
    assert got == ("/v/bin/python -m grader grade 'my drop.zip' --out res --roster r.csv --executor "
                   "slurm --partition gpu --only bob 'o'\"'\"'neil'")
    assert shlex.split(got)[-3:] == ["--only", "bob", "o'neil"]
    assert regrade_command("", ["bob"], out_dir=Path("r s"), python="py") == \
        "py -m grader grade --out 'r s' --only bob"
    assert regrade_command("python -m grader grade x --only=a", ["b"], out_dir=Path("o"),
                           python="py") == "py -m grader grade x --only b"


def _course(tmp_path, extra_missing: int = 0):
    """A GPU run's results: two ranked, one mismatch, one waiting for review, one the machine
    failed on, one with no result, one not on the roster; and a roster with students missing."""
    out = tmp_path / "results"
    out.mkdir()
    got = results() + [sample("rev", Status.REVIEW), env_error("bob"), sample("zed", Status.PASS),
                       placeholder(dict(id="carl"), out / "carl.json", "truncated or not JSON (x)")]
    run = dict(RUN, command="python -m grader grade 'the drop' --out results --force")
    missing = [f"m{i}" for i in range(2 + extra_missing)]
    roster = tmp_path / "roster.csv"
    roster.write_text("folder,name\n" + "".join(f"{f},N\n" for f in
                                                ["fast", "slow", "broken", "rev", "bob", "carl", *missing]))
    return out, got, run, roster, missing


def test_the_summary_says_what_is_left_to_do_with_a_roster(tmp_path):
    out, got, run, roster, missing = _course(tmp_path)
    outcome = run_outcome(out, got, run, policy=POLICY, roster=roster)
    text = outcome_text(outcome, out_dir=out, code=exit_status(0, got))
    lines = text.splitlines()
    assert f"summary of the run in {out}:" in lines
    assert "  statuses: 7 submissions: 1 environment_error · 1 mismatch · 1 review · 1 no_result · " \
           "3 pass · 2 missing" in lines
    assert "  roster:   2 of 8 students with no submission: m0, m1; not on the roster: zed" in lines
    # the spread is the rows' own scores, by the policy, as the page and grades.csv have them
    scores = sorted(r.score.total for r in build_rows(got, run=run, policy=POLICY) if r.score)
    assert f"min {scores[0]:.2f}" in text and f"max {scores[-1]:.2f}" in text and "(of 45.00)" in text
    assert "  times:    2 ranked, median ms: fastest 2.000 · median 11.000 · slowest 20.000" in lines
    assert any(l.startswith("  review:   1 wait(s) for an instructor's review") and "rev;" in l
               for l in lines)
    # the last lines: what has no final verdict, then the command that regrades just that
    assert lines[-4].startswith("NO FINAL VERDICT for 2 entries (exit status 4)")
    assert lines[-3].split()[:2] == ["bob", "environment_error"]
    assert lines[-2].split()[:2] == ["carl", "no_result"] and "carl.json" in lines[-2]
    assert lines[-1] == "regrade just these: " + shlex.join(
        [sys.executable, "-m", "grader", "grade", "the drop", "--out", "results", "--only", "bob", "carl"])
    assert HIDDEN not in text and "hidden case 1" in text   # no hidden case's id or shape


def test_long_lists_are_cut_and_named_whole_in_the_summary_file(tmp_path):
    out, got, run, roster, missing = _course(tmp_path, extra_missing=5)
    got += [env_error(f"e{i}") for i in range(5)]
    text = outcome_text(run_outcome(out, got, run, policy=POLICY, roster=roster), out_dir=out, code=4)
    assert f"m0, m1, m2, m3, m4 and 2 more (see {out / '_summary.json'})" in text
    assert f"  and 2 more (see {out / '_summary.json'})" in text
    assert text.splitlines()[-1].endswith("--only bob carl e0 e1 e2 e3 e4")   # every one of them
    (out / RUN_FILE).write_text(json.dumps(run))
    write_reports(out, policy=POLICY, roster=roster, results=got)
    whole = json.loads((out / "_summary.json").read_text())["outcome"]
    assert whole["missing"] == missing and not whole["final"]
    assert [e["id"] for e in whole["regrade"]] == ["bob", "carl", "e0", "e1", "e2", "e3", "e4"]


def test_all_final_says_so_and_review_waits_without_a_regrade(tmp_path):
    got = results() + [sample("rev", Status.REVIEW)]
    text = outcome_text(run_outcome(tmp_path, got, RUN, policy=POLICY), out_dir=tmp_path,
                        code=exit_status(0, got))
    assert text.splitlines()[-1] == "every entry has a final verdict (exit status 0)"
    assert "review:   1 wait(s)" in text and "regrade" not in text and "roster:" not in text
    no_gpu = dict(RUN, device=dict(RUN["device"], cuda=False))
    text = outcome_text(run_outcome(tmp_path, got, no_gpu, policy=POLICY), out_dir=tmp_path)
    assert "  scores:   none (no CUDA device on the grading machine)" in text.splitlines()


def _other_versions(out: Path) -> dict:
    """A run whose result files were written by other grader versions: alice's of schema 0
    without a label, bob's with a status this grader does not know, carol's truncated, dave's
    of this grader; and erin's without a schema whose cases cannot be read."""
    good = lambda id, status=Status.MISMATCH: sample(id, status).to_dict()
    files = dict(alice={k: v for k, v in {**good("alice"), "schema": 0}.items() if k != "label"},
                 bob={**good("bob"), "status": "crashed"}, dave=good("dave", Status.PASS),
                 erin={**{k: v for k, v in good("erin").items() if k != "schema"},
                       "cases": [{"case": "x", "status": "melted"}]})
    for id, data in files.items():
        (out / f"{id}.json").write_text(json.dumps(data))
    (out / "carol.json").write_text(json.dumps(good("carol"))[:60])
    ids = ["alice", "bob", "carol", "dave", "erin"]
    run = dict(RUN, command=f"python -m grader grade subs --out {out}", roster=[
        dict(id=i, role="student", kind="cuda", label=i, result=f"{i}.json", key=None) for i in ids])
    (out / RUN_FILE).write_text(json.dumps(run))
    return run


def test_results_of_other_grader_versions_are_read_with_a_note(tmp_path):
    run = _other_versions(tmp_path)
    got = {r.id: r for r in read_results(tmp_path, run)}
    assert list(got) == ["alice", "bob", "carol", "dave", "erin"]   # none dropped
    alice = got["alice"]
    assert alice.status is Status.MISMATCH and not alice.no_result and len(alice.cases) == 2
    assert alice.version_note == ("written by an older grader (schema 0; field 'label' missing): "
                                  "regrade with --only alice to refresh")
    assert alice.message.startswith(f"[{alice.version_note}]") and alice.label == "alice"
    bob = got["bob"]
    assert bob.status is Status.NO_RESULT and bob.no_result and len(bob.cases) == 2   # cases kept
    assert "another grader version (status 'crashed' unknown to this grader)" in bob.message
    carol = got["carol"]
    assert carol.status is Status.NO_RESULT and str(tmp_path / "carol.json") in carol.message
    assert "truncated or not JSON" in carol.message and "regrade it with --only carol" in carol.message
    assert got["dave"].status is Status.PASS and not got["dave"].version_note
    erin = got["erin"]   # its status, without the cases that score it: shown, never scored
    assert erin.status is Status.MISMATCH and erin.cases == () and "field 'cases' unreadable" in erin.message
    assert "older grader (no schema number" in erin.message and erin.partial and not alice.partial
    rows = {r.result.id: r for r in build_rows(list(got.values()), run=run, policy=POLICY)}
    assert rows["erin"].score is None and rows["alice"].score is not None
    assert exit_status(0, list(got.values())) == 4   # bob's, carol's and erin's are no verdict
    assert exit_status(0, [alice, got["dave"]]) == 0   # read fully enough: final
    untimed = {k: v for k, v in sample("gus", Status.PASS).to_dict().items() if k != "timing"}
    (tmp_path / "gus.json").write_text(json.dumps({**untimed, "schema": 0}))
    gus = read_result(tmp_path / "gus.json", dict(id="gus"))   # a pass without its timing
    assert gus.status is Status.PASS and gus.partial and "field 'timing' missing" in gus.version_note


def test_other_versions_and_damaged_results_are_on_every_report(tmp_path, capsys):
    run = _other_versions(tmp_path)
    roster = tmp_path / "roster.csv"
    roster.write_text("folder\nalice\nbob\ncarol\ndave\nerin\n")
    assert main(["leaderboard", "--out", str(tmp_path), "--roster", str(roster)]) == 0   # a re-render
    printed = capsys.readouterr().out
    page = html.unescape((tmp_path / "leaderboard.html").read_text())
    grades = {r["submission"]: r for r in csv.DictReader(io.StringIO(
        (tmp_path / "grades.csv").read_text(encoding="utf-8-sig")))}
    for id in ("alice", "bob", "carol", "erin"):
        assert grades[id]["status"] != "missing" and grades[id]["message"] != "no submission folder"
    assert "written by an older grader (schema 0; field 'label' missing)" in grades["alice"]["message"]
    assert grades["alice"]["status"] == "mismatch" and grades["bob"]["status"] == "no_result"
    assert "carol.json: truncated or not JSON" in grades["carol"]["message"]
    assert grades["erin"]["score"] == "" and grades["alice"]["score"] == "5.00"
    for text in (" ".join(page.split()), " ".join(printed.split())):   # the table wraps verdicts
        assert "regrade with --only alice to refresh" in text
        assert "status 'crashed' unknown to this grader" in text
        assert "carol.json: truncated or not JSON" in text
    assert (tmp_path / "feedback" / "alice.md").exists() and (tmp_path / "feedback" / "carol.md").exists()
    lines = printed.splitlines()
    assert any(l.startswith("  version:  1 result(s)") and ": alice;" in l for l in lines)
    assert lines[-5].startswith("NO FINAL VERDICT for 3 entries, through no fault")
    assert [l.split()[:2] for l in lines[-4:-1]] == [["bob", "no_result"], ["carol", "no_result"],
                                                    ["erin", "mismatch"]]
    assert lines[-1].endswith(f"grade subs --out {tmp_path} --only bob carol erin")
    assert "every entry has a final verdict" not in printed and "(exit status" not in printed


def test_a_run_file_from_before_rosters_shows_every_result_file(tmp_path):
    """An older grader's run file has no roster: every result file in the folder is shown, a
    damaged one as no_result, never left out (so never 'no submission folder' on the roster)."""
    (tmp_path / RUN_FILE).write_text(json.dumps(RUN))
    write_result(tmp_path, sample("dave"))
    (tmp_path / "broken.json").write_text("{")
    old = {k: v for k, v in sample("alice").to_dict().items() if k != "schema"}
    (tmp_path / "alice.json").write_text(json.dumps(old))
    got = {r.id: r for r in read_results(tmp_path)}
    assert sorted(got) == ["alice", "broken", "dave"]
    assert got["broken"].no_result and "broken.json: truncated or not JSON" in got["broken"].message
    assert "regrade it with --only broken" in got["broken"].message
    assert got["alice"].status is Status.MISMATCH and "older grader" in got["alice"].version_note
    roster = tmp_path / "roster.csv"
    roster.write_text("folder\nalice\nbroken\ndave\n")
    write_reports(tmp_path, policy=POLICY, roster=roster)
    grades = (tmp_path / "grades.csv").read_text(encoding="utf-8-sig")
    assert "no submission folder" not in grades and ",missing," not in grades
    assert "alice" in terminal_table(tmp_path, list(got.values()), RUN)


SYNTAX_ERROR = "def custom_kernel(data)\n    return data\n"


@pytest.mark.slow
def test_grade_exits_4_and_prints_the_command_that_regrades_just_those(tmp_path):
    """The whole grader on the CPU: a run left with an environment_error (bob's result, kept by
    --only) and a damaged result (carol's) exits 4, naming them last with the command that
    regrades just them; that command, run as printed, grades them and exits 0."""
    subs, cases = tmp_path / "subs", tmp_path / "cases.txt"
    for id in ("alice", "bob", "carol"):
        (subs / id).mkdir(parents=True)
        (subs / id / "submission.py").write_text(SYNTAX_ERROR)
    cases.write_text("batch_size: 1; num_heads: 2; seq_len: 77; head_dim: 64; seed: 2\n")
    out = tmp_path / "results"
    env = {**os.environ, "GRADER_SCRATCH_DIR": str(tmp_path), "GRADER_LOCK_DIR": str(tmp_path / "locks")}
    args = ["grade", str(subs), "--out", str(out), "--build-dir", str(tmp_path / "build"), "--cases",
            str(cases), "--no-hidden", "--cpu", "--no-solution"]
    grade = lambda argv: subprocess.run(argv, capture_output=True, text=True, cwd=config.REPO_ROOT,
                                        env=env, timeout=300)
    first = grade([sys.executable, "-m", "grader", *args])
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    assert first.stdout.splitlines()[-1] == "every entry has a final verdict (exit status 0)"
    bob = json.loads((out / "bob.json").read_text())
    (out / "bob.json").write_text(json.dumps({**bob, "status": "environment_error",
                                              "message": "the grading machine failed"}))
    (out / "carol.json").write_text((out / "carol.json").read_text()[:80])
    second = grade([sys.executable, "-m", "grader", *args, "--only", "alice"])
    assert second.returncode == 4, second.stdout[-2000:] + second.stderr[-3000:]
    *_, head, bob_line, carol_line, command = second.stdout.splitlines()
    assert head.startswith("NO FINAL VERDICT for 2 entries (exit status 4)")
    assert bob_line.split()[:2] == ["bob", "environment_error"]
    assert carol_line.split()[:2] == ["carol", "no_result"] and "carol.json" in carol_line
    assert command == "regrade just these: " + shlex.join(
        [sys.executable, "-m", "grader", *args, "--only", "bob", "carol"])
    third = grade(shlex.split(command.removeprefix("regrade just these: ")))
    assert third.returncode == 0, third.stdout[-2000:] + third.stderr[-3000:]
    assert {r.id: r.status.value for r in read_results(out)} == \
        dict(alice="build_error", bob="build_error", carol="build_error")
    assert SCHEMA_VERSION == json.loads((out / "carol.json").read_text())["schema"]

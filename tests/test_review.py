"""The review queue and the instructors' decisions (grader/course/review.py, issue 30): what the queue
holds and why, decisions that hold for one source only, every report following them, the
instructors' page showing the queue and the students' page never, the `review` command's
errors, and the round trip on the real grader (grade, decide, regrade, change the source)."""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from grader.common import config
from grader.cli.main import main
from grader.course.verdicts import BuildResult
from grader.course.verdicts import CaseResult
from grader.report.gradescope import problems
from grader.course.policy import Policy
from grader.report.pages import RUN_FILE, review_entries, terminal_table, write_reports
from grader.report.rows import build_rows
from grader.course.results import KernelShare, SubmissionResult, read_results, write_result
from grader.course.review import (CLEARED, DECISIONS_FILE, DISQUALIFIED, Decision, ReviewError,
                           apply_decisions, decision_log, load_decisions, make_decision,
                           read_source, record_decision, review_queue)
from grader.course.submission import folder_digest
from grader.common.status import Status
from grader.trusted.timing import summarize

POLICY = Policy(pseudonym_salt="review-test", review_top=2)
CASES = [dict(id="b1_h2_s77_d64", hidden=True, line="batch_size: 1; num_heads: 2; seq_len: 77; "
              "head_dim: 64; seed: 11"),
         dict(id="b1_h4_s130_d128", hidden=False, line="batch_size: 1; num_heads: 4; seq_len: 130; "
              "head_dim: 128; seed: 3")]
RUN = dict(started_at="2026-11-27T00:00:00+00:00", finished_at="2026-11-27T00:10:00+00:00",
           device=dict(cuda=True, name="NVIDIA H100", driver="580", torch_version="2.13",
                       cuda_version="13.0", grader_version="0.1.0", matmul_tflops=700.0),
           cases=CASES, timed_case="b1_h4_s130_d128", rtol=0.01, atol=0.01)
MARKER = "UNIQUE_SOURCE_MARKER_7f3a"     # a line of every student's source: never student-facing
FINDING = "submission.py line 3: statistics (not a module a kernel needs)"
AUDIT_NOTE = "submission.cu line 9: an integer cast to a pointer"


def timing(ms: float):
    return summarize([ms, ms], flops=7 * 10**11, warmup_calls=2, budget_s=5, stopped_by="rse", wall_s=1)


def _result(id: str, status: Status, ms: float | None, *, source: str = "", role: str = "student",
            **extra) -> SubmissionResult:
    passed = status in (Status.PASS, Status.REVIEW)
    cases = tuple(CaseResult(c["id"], Status.PASS if passed or c["hidden"] else Status.MISMATCH,
                             "" if passed else "bad", c["hidden"]) for c in CASES)
    return SubmissionResult(
        id=id, label=id, kind="python" if role == "student" else "builtin", role=role,
        status=status, message=f"{status.value} verdict of {id}", hint="",
        build=BuildResult(Status.PASS, "import", 1.0), cases=cases,
        timed_case=CASES[1]["id"] if ms else None, timing=timing(ms) if ms else None,
        graded_at="2026-11-27T00:05:00+00:00",
        key=(("grader", "g1"), ("source", source)) if source else (), **extra)


STUDENTS = {   # id: (status, median ms); baselines: FLASH 3 ms, cuDNN 2.5 ms, PyTorch 10 ms
    "rev": (Status.REVIEW, 1.0), "quick": (Status.PASS, 2.0), "mid": (Status.PASS, 5.0),
    "slow": (Status.PASS, 8.0), "broken": (Status.MISMATCH, None)}


def make_course(tmp_path: Path) -> Path:
    """A graded run on disk: each student's folder (with its source), result and roster entry
    (its folder recorded, runs.Entry.roster), and the baselines."""
    out, subs = tmp_path / "results", tmp_path / "subs"
    roster = []
    for id, (status, ms) in STUDENTS.items():
        folder = subs / id
        folder.mkdir(parents=True)
        (folder / "submission.py").write_text(
            f"# {id}: {MARKER}\nimport torch\nimport statistics\n# <script>alert('{id}')</script>\n"
            f"def custom_kernel(data):\n    return data[0]\n")
        extra = dict(review=(FINDING,), audit_notes=(AUDIT_NOTE,),
                     kernels=(KernelShare("_attn_fwd", 40, 0.9, 0.9, "submission.py line 12"),
                              KernelShare("cudnn_fmha", 40, 0.1, 0.1, "library"))) if id == "rev" else {}
        write_result(out, _result(id, status, ms, source=folder_digest(folder), **extra))
        roster.append(dict(id=id, role="student", kind="python", label=id, result=f"{id}.json",
                           key=None, folder=str(folder)))
    for id, ms in (("torch_reference", 10.0), ("sdpa_flash", 3.0), ("sdpa_cudnn", 2.5)):
        write_result(out, _result(id, Status.PASS, ms, role="baseline"))
        roster.append(dict(id=id, role="baseline", kind="builtin", label=id,
                           result=f"baselines/{id}.json", key=None))
    (out / RUN_FILE).write_text(json.dumps(dict(RUN, roster=roster, submissions=list(STUDENTS))))
    return out


@pytest.fixture
def course(tmp_path) -> Path:
    return make_course(tmp_path)


def queue_of(out: Path, *, top: int = 2) -> dict:
    results = read_results(out)
    run = json.loads((out / RUN_FILE).read_text())
    return {e.id: e for e in review_entries(out, results, run, dataclasses.replace(POLICY, review_top=top))}


def decide(out: Path, id: str, decision: str, note: str = "looked at it") -> Decision:
    graded = next(r for r in read_results(out) if r.id == id)
    d = make_decision(graded, decision, note, by="ta")
    record_decision(out, d)
    return d


def grades(out: Path) -> dict[str, dict]:
    text = (out / "grades.csv").read_bytes().decode("utf-8-sig")
    return {row["submission"]: row for row in csv.DictReader(io.StringIO(text))}


# ---------------------------------------------------------------- the queue


def test_the_queue_holds_review_results_the_top_n_and_times_at_a_librarys_speed(course):
    queue = queue_of(course)
    assert set(queue) == {"rev", "quick", "mid"}     # slow (rank 3 of 3, 8 ms) and broken are not
    assert queue["rev"].reasons == ("review: uses code the grader's audit cannot account for",)
    assert queue["rev"].rank is None and not queue["rev"].result.ranked   # never ranked by itself
    quick = queue["quick"].reasons
    assert quick[0] == "rank 1: in the top 2" and len(quick) == 3
    assert "at or faster than sdpa_flash (2.000 ms against 3.000 ms" in quick[1]
    assert "at or faster than sdpa_cudnn (2.000 ms against 2.500 ms" in quick[2]
    assert queue["mid"].reasons == ("rank 2: in the top 2",)
    # top = 0: only what the audit or a library's speed puts there
    assert set(queue_of(course, top=0)) == {"rev", "quick"}
    assert all(e.pending for e in queue.values())
    assert [e.id for e in queue.values()][0] == "rev"   # waiting review results first


def test_a_time_equal_to_a_librarys_is_queued_and_a_slower_one_is_not():
    results = [_result("tie", Status.PASS, 3.0, source="s1"), _result("after", Status.PASS, 3.001, source="s2"),
               _result("sdpa_flash", Status.PASS, 3.0, role="baseline")]
    [entry] = review_queue(results, {}, top=0, with_source=False)
    assert entry.id == "tie" and entry.reasons[0].startswith("at or faster than sdpa_flash (3.000 ms")


def test_in_a_run_on_several_gpus_a_time_is_compared_with_its_own_gpus_library_rows():
    from grader.course.results import GpuRef
    on = lambda r, i: dataclasses.replace(r, gpu=GpuRef(i, "NVIDIA H100"))
    results = [on(_result("first", Status.PASS, 2.0, source="s1"), 0),
               on(_result("second", Status.PASS, 2.0, source="s2"), 1),
               on(_result("sdpa_flash", Status.PASS, 3.0, role="baseline"), 0)]
    by_gpu = {0: {"sdpa_flash": 3.0}, 1: {"sdpa_flash": 1.5}}   # GPU 1's FLASH row: 1.5 ms
    assert [e.id for e in review_queue(results, {}, top=0, by_gpu=by_gpu, with_source=False)] == ["first"]


def test_an_entry_carries_its_kernels_the_audits_findings_and_notes_and_its_source(course):
    rev = queue_of(course)["rev"]
    assert rev.result.review == (FINDING,) and rev.result.audit_notes == (AUDIT_NOTE,)
    assert [(k.name, k.share, k.defined_at) for k in rev.result.kernels] == [
        ("_attn_fwd", 0.9, "submission.py line 12"), ("cudnn_fmha", 0.1, "library")]
    assert rev.source.note == "" and "==> submission.py <==" in rev.source.text
    assert MARKER in rev.source.text


def test_the_source_says_plainly_when_the_folder_is_gone_changed_or_unsafe(tmp_path):
    folder = tmp_path / "sub"
    folder.mkdir()
    (folder / "submission.py").write_text("x = 1\n" * 20_000)
    graded = folder_digest(folder)
    shown = read_source(folder, graded, limit=1000)
    assert len(shown.text) == 1000 and "shown: the first 1,000 of" in shown.note
    (folder / "helper.py").write_text("y = 2\n")
    assert "has changed since it was graded" in read_source(folder, graded).note
    assert "is gone" in read_source(tmp_path / "nowhere", graded).note
    assert read_source(tmp_path / "nowhere", graded).text == ""
    assert "does not say where its folder is" in read_source(None, graded).note
    # a named pipe would block a read in the grader's own process: the folder is not read
    os.mkfifo(folder / "pipe.py")
    done = []
    reader = threading.Thread(target=lambda: done.append(read_source(folder, graded)), daemon=True)
    reader.start()
    reader.join(20)
    assert done and "pipe.py, which is not a regular file: not read" in done[0].note
    assert done[0].text == ""


# ---------------------------------------------------------------- decisions


def test_a_cleared_review_result_ranks_with_its_measured_time(course):
    decide(course, "rev", CLEARED, "statistics.fmean on the host only")
    [shown] = [r for r in apply_decisions(read_results(course), load_decisions(course)) if r.id == "rev"]
    assert shown.status is Status.PASS and shown.ranked and shown.timing.median_ms == 1.0
    assert "cleared after an instructor's review" in shown.message
    assert any("statistics.fmean on the host only" in n and "(the audit had said:" in n for n in shown.notes)
    rows = build_rows(apply_decisions(read_results(course), load_decisions(course)), run=RUN, policy=POLICY)
    assert next(r for r in rows if r.result.id == "rev").rank == 1
    # it stays in the queue, with its decision, no longer waiting
    rev = queue_of(course)["rev"]
    assert not rev.pending and rev.state.startswith("cleared on") and rev.rank == 1


def test_a_disqualified_result_is_flagged_with_the_note_and_never_ranked(course):
    decide(course, "quick", DISQUALIFIED, "calls cuDNN through a data file")
    shown = {r.id: r for r in apply_decisions(read_results(course), load_decisions(course))}
    quick = shown["quick"]
    assert quick.status is Status.FLAGGED and not quick.ranked
    assert quick.message == "disqualified after an instructor's review: calls cuDNN through a data file"
    # the next one moves up into the top 2, and so into the queue
    assert set(queue_of(course)) == {"rev", "quick", "mid", "slow"}
    assert queue_of(course)["slow"].reasons == ("rank 2: in the top 2",)


def test_a_cleared_ranked_result_stays_ranked_and_applying_twice_changes_nothing(course):
    decide(course, "quick", CLEARED, "an honest Triton kernel")
    decisions = load_decisions(course)
    once = apply_decisions(read_results(course), decisions)
    assert apply_decisions(once, decisions) == once
    quick = next(r for r in once if r.id == "quick")
    assert quick.status is Status.PASS and quick.ranked
    assert quick.notes[-1].endswith("an honest Triton kernel") and quick.message.startswith("pass verdict")


def test_a_decision_holds_through_a_regrade_of_the_same_source_and_not_a_changed_one(course, tmp_path):
    decide(course, "rev", CLEARED)
    graded = next(r for r in read_results(course) if r.id == "rev")
    # regraded from the same source (another grader, another day): the decision holds
    regraded = dataclasses.replace(graded, key=(("grader", "g2"), ("source", dict(graded.key)["source"])),
                                   graded_at="2026-11-28T00:00:00+00:00")
    write_result(course, regraded)
    assert next(r for r in apply_decisions(read_results(course), load_decisions(course))
                if r.id == "rev").status is Status.PASS
    # the student changed the source: the decision is stale, not applied, and it waits again
    (tmp_path / "subs" / "rev" / "submission.py").write_text("# changed\n")
    write_result(course, dataclasses.replace(graded, key=(("grader", "g2"),
                                                          ("source", folder_digest(tmp_path / "subs" / "rev")))))
    shown = next(r for r in apply_decisions(read_results(course), load_decisions(course)) if r.id == "rev")
    assert shown.status is Status.REVIEW and not shown.ranked
    rev = queue_of(course)["rev"]
    assert rev.stale and rev.pending and rev.state.startswith("STALE: cleared")
    assert "its cleared decision was made on another source" in rev.reasons


def test_a_decision_never_overrules_the_machine_or_a_failing_regrade(course):
    decide(course, "rev", DISQUALIFIED, "no")
    decide(course, "quick", CLEARED)
    results = {r.id: r for r in read_results(course)}
    down = [dataclasses.replace(results["rev"], status=Status.ENVIRONMENT_ERROR),
            dataclasses.replace(results["quick"], status=Status.TIMEOUT)]
    assert apply_decisions(down, load_decisions(course)) == down


def test_the_decisions_file_keeps_every_decision_and_the_latest_holds(course):
    decide(course, "rev", DISQUALIFIED, "first look")
    decide(course, "rev", CLEARED, "second look: fine")
    assert [(d.decision, d.note) for d in decision_log(course)] == [
        (DISQUALIFIED, "first look"), (CLEARED, "second look: fine")]
    assert load_decisions(course)["rev"].decision == CLEARED
    assert load_decisions(course)["rev"].source == folder_digest(course.parent / "subs" / "rev")
    assert not list(course.glob(".*.tmp"))
    (course / DECISIONS_FILE).write_text('{"schema": 1, "decisions": [{"id": "rev"}]}')
    with pytest.raises(ReviewError, match=r"_review.json: a decision lacks decision, note, when, source"):
        load_decisions(course)
    (course / DECISIONS_FILE).write_text("{")
    with pytest.raises(ReviewError, match=r"_review.json: unreadable .*remove it and decide again"):
        write_reports(course, policy=POLICY)   # never rendered without the decisions


# ---------------------------------------------------------------- every report follows


def test_grades_exports_and_feedback_follow_a_decision(course, tmp_path):
    from .test_roster import write_roster
    roster = write_roster(tmp_path, "folder,sid,email,name,canvas_id,section\n"
                                    "rev,1,r@u.edu,Rev,11,A\nquick,2,q@u.edu,Quick,12,A\n")
    write_reports(course, policy=POLICY, roster=roster)
    before = grades(course)
    assert before["rev"]["status"] == "review" and before["rev"]["rank"] == ""
    assert before["rev"]["correctness_points"] == "15.00" and before["rev"]["performance_points"] == "0.00"
    md = (course / "feedback" / "rev.md").read_text()
    assert "## Waiting for an instructor's review" in md and "This is not a cheating verdict" in md
    assert f"- `{FINDING}`" in md and "no performance points until an instructor's review clears it" in md
    doc = json.loads((course / "gradescope" / "rev" / "results.json").read_text())
    assert problems(doc) == [] and "leaderboard" not in doc and "not a cheating verdict" in doc["output"]
    assert FINDING in doc["output"]
    canvas = (course / "canvas.csv").read_text(encoding="utf-8-sig")
    assert "Rev,11,1,,A,15.00" in canvas

    decide(course, "rev", CLEARED, "statistics on the host only")
    decide(course, "quick", DISQUALIFIED, "calls a library through a data file")
    write_reports(course, policy=POLICY, roster=roster)
    after = grades(course)
    assert after["rev"]["status"] == "pass" and after["rev"]["rank"] == "1"
    assert float(after["rev"]["performance_points"]) == 30.0          # 1 ms: faster than FLASH
    assert after["quick"]["status"] == "flagged" and after["quick"]["rank"] == ""
    assert after["quick"]["message"] == "disqualified after an instructor's review: calls a library through a data file"
    assert after["mid"]["rank"] == "2"
    md = (course / "feedback" / "rev.md").read_text()
    assert "Waiting for" not in md and "statistics on the host only" in md and "**Rank:** 1" in md
    assert "disqualified after an instructor's review" in (course / "feedback" / "quick.md").read_text()
    assert json.loads((course / "gradescope" / "rev" / "results.json").read_text())["leaderboard"][0]["value"] == 1.0
    assert "leaderboard" not in json.loads((course / "gradescope" / "quick" / "results.json").read_text())
    canvas = (course / "canvas.csv").read_text(encoding="utf-8-sig")
    assert "Rev,11,1,,A,45.00" in canvas
    summary = json.loads((course / "_summary.json").read_text())
    assert {r["id"]: r["status"] for r in summary["rows"]}["rev"] == "pass"
    assert {e["id"]: e["decision"]["decision"] for e in summary["review"] if e["decision"]} == {
        "rev": CLEARED, "quick": DISQUALIFIED}


def test_what_a_student_sees_of_the_audit_is_scrubbed_and_its_notes_are_withheld(course, tmp_path):
    from grader.report.privacy import Redactor
    r = next(r for r in read_results(course) if r.id == "rev")
    shown = Redactor.for_run(RUN).student_result(dataclasses.replace(
        r, review=(f"{tmp_path}/subs/rev/submission.py line 3: statistics",)))
    assert shown.review == ("…/submission.py line 3: statistics",) and shown.audit_notes == ()


def test_the_terminal_table_follows_the_decisions_and_says_what_waits(course):
    results, run = read_results(course), json.loads((course / RUN_FILE).read_text())
    table = terminal_table(course, results, run)
    assert "1 submission waits for an instructor's review before ranking" in table
    decide(course, "rev", CLEARED)
    table = terminal_table(course, results, run)
    assert "waits for" not in table
    rev = next(line for line in table.splitlines() if " rev " in line)
    assert rev.split()[:3] == ["1", "rev", "pass"]


# ---------------------------------------------------------------- the pages


def test_the_instructors_page_has_the_review_section_and_the_students_page_none_of_it(course):
    decide(course, "quick", CLEARED, "honest")
    paths = write_reports(course, policy=POLICY)
    page = paths["leaderboard"].read_text()
    assert '<h2 id="review">Review</h2>' in page and 'id="review-rev"' in page
    assert "3 submissions in the review queue, 2 waiting for a decision" in page
    assert MARKER in page and FINDING in page and AUDIT_NOTE in page
    assert "&lt;script&gt;alert(&#39;rev&#39;)&lt;/script&gt;" in page and "<script>alert(" not in page
    assert "<code>_attn_fwd</code></td><td class=\"num\">40</td><td class=\"num\">0.900</td><td class=\"num\">90.0%" in page
    assert "cleared on" in page and "by ta" in page
    assert "make review ID=rev DECISION=cleared" in page
    # the review row: listed with its status, not ranked
    board = page.split('<table id="board">')[1].split("</table>")[0]
    rev_row = next(b for b in board.split("<tbody") if 'href="#sub-rev"' in b)
    assert 's-review">review<' in rev_row and 'class="rank num" data-sort="999999"></td>' in rev_row
    students = paths["students"].read_text()
    for secret in (MARKER, 'id="review', "Review</h2>", AUDIT_NOTE, "alert(", "_attn_fwd", "make review"):
        assert secret not in students, secret
    # a time that does not rank is not on the students' page
    rev_public = next(b for b in students.split('<table id="board">')[1].split("<tbody")
                      if 's-review">review<' in b)
    assert 'title="not timed"' in rev_public and "1.000" not in rev_public
    for path in [*(course / "feedback").glob("*.md"), *(course / "gradescope").glob("*/results.json")]:
        text = path.read_text()
        assert MARKER not in text and AUDIT_NOTE not in text, path


def test_the_chart_draws_only_times_that_rank(course):
    from grader.report.pages import chart
    rows = build_rows(read_results(course), run=RUN, policy=POLICY)
    names = {b["name"] for b in chart(rows)["bars"]}
    assert "rev" not in names and {"quick", "mid", "slow", "sdpa_flash"} <= names


# ---------------------------------------------------------------- the command


def review(out: Path, *args: str, capsys) -> tuple[int, str, str]:
    code = main(["review", "--out", str(out), *args])
    got = capsys.readouterr()
    return code, got.out, got.err


def test_review_lists_the_queue_and_shows_one_in_full(course, capsys):
    code, out, _ = review(course, capsys=capsys)      # grading.toml: [review] top = 10
    assert code == 0 and "4 submissions, 4 waiting for a decision" in out and "the top 10 ranked" in out
    assert "rev  review" in out and f"audit: {FINDING}" in out and MARKER not in out
    assert "kernel:  90.0%  _attn_fwd x 40" in out
    code, out, _ = review(course, "rev", capsys=capsys)
    assert code == 0 and MARKER in out and "==> submission.py <==" in out and "quick" not in out
    code, out, _ = review(course, "broken", capsys=capsys)
    assert code == 0 and "broken is mismatch: not in the review queue" in out


@pytest.mark.parametrize("args, error", [
    (["rve", "--clear"], "no submission named 'rve' in this run; did you mean rev?"),
    (["nobody", "--clear"], "no submission named 'nobody' in this run; its submissions: broken, mid"),
    (["rev", "--disqualify"], "rev: a disqualification needs --note"),
    (["rev", "--disqualify", "--note", "  "], "rev: a disqualification needs --note"),
    (["broken", "--clear", "--note", "x"], "broken is mismatch: not in the review queue and not ranked"),
    (["--clear", "--note", "x"], "name the submission to decide on"),
    (["rev", "--note", "x"], "--note goes with --clear or --disqualify"),
    (["rve"], "no submission named 'rve' in this run; did you mean rev?"),
])
def test_review_refuses_what_it_cannot_decide_and_records_nothing(course, capsys, args, error):
    code, _, err = review(course, *args, capsys=capsys)
    assert code == 2 and error in err, err
    assert not (course / DECISIONS_FILE).exists() and not (course / "leaderboard.html").exists()


def test_review_decides_on_a_ranked_one_outside_the_queue_and_rerenders(course, capsys, tmp_path):
    top2 = tmp_path / "top2.toml"
    top2.write_text(config.REPO_ROOT.joinpath("grading.toml").read_text().replace("top = 10", "top = 2"))
    assert "slow" not in queue_of(course, top=2)
    code, out, err = review(course, "slow", "--disqualify", "--note", "copied", "--by", "prof",
                            "--policy", str(top2), capsys=capsys)
    assert code == 0, err
    assert "recorded in" in err and "slow disqualified" in err
    assert load_decisions(course)["slow"].by == "prof"
    assert grades(course)["slow"]["status"] == "flagged"          # re-rendered at once
    assert "slow" in out and "flagged" in out                      # the leaderboard's table
    with pytest.raises(SystemExit) as e:                           # argparse: a named choice
        main(["review", "--out", str(course), "rev", "--decision", "clear"])
    assert e.value.code == 2 and "invalid choice: 'clear'" in capsys.readouterr().err


def test_review_without_a_run_says_so(tmp_path, capsys):
    code, _, err = review(tmp_path, capsys=capsys)
    assert code == 2 and "_run.json: no such file" in err


# ---------------------------------------------------------------- the round trip, on the CPU

# A correct kernel that uses a module no kernel wrapper needs (statistics; its arithmetic in
# numpy, which runs on any CPU): the audit cannot account for it (issue 30's allowlist), so it
# passes its cases and waits for review. Its honest twin, the Triton example (Triton's
# interpreter runs it on the CPU), passes and is in no queue: on the CPU nothing is timed, so
# nothing ranks.
ATTENTION = """
    import numpy as np
    import torch

    def attention(q, k, v):
        q, k, v = (t.detach().cpu().float().numpy() for t in (q, k, v))
        s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
        p = np.exp(s - s.max(-1, keepdims=True))
        return torch.from_numpy(p / p.sum(-1, keepdims=True) @ v).half()

    def custom_kernel(data):
        q, k, v = data
        return attention(q, k, v).to(q.device)
"""
OFF_THE_LIST = f"# {MARKER}\nimport statistics\n" + textwrap.dedent(ATTENTION).replace(
    "s = q @", "s = statistics.fmean([1.0]) * q @")
CPU_CASES = ("batch_size: 1; num_heads: 2; seq_len: 1; head_dim: 64; seed: 1\n"
             "batch_size: 2; num_heads: 2; seq_len: 77; head_dim: 64; seed: 2\n")


def _grade(root: Path, tmp: Path, *more: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "grader", "grade", str(root), "--out", str(tmp / "results"),
         "--build-dir", str(tmp / "build"), "--cases", str(tmp / "cases.txt"), "--no-hidden",
         "--cpu", "--no-solution", *more],
        capture_output=True, text=True, cwd=config.REPO_ROOT, timeout=900,
        env={**os.environ, "GRADER_RUN_S": "60"})


@pytest.mark.slow
def test_make_review_round_trip_on_the_real_grader(tmp_path):
    """grade (the submission off the allowlist waits for review), `make review` clears it, the
    page and the feedback follow; a forced regrade of the same source keeps the decision; a
    changed source makes it stale and puts the submission back in the queue."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("no make")
    root, out = tmp_path / "subs", tmp_path / "results"
    (root / "stats_user").mkdir(parents=True)
    (root / "stats_user" / "submission.py").write_text(OFF_THE_LIST)
    shutil.copytree(config.REPO_ROOT / "examples" / "triton_flash", root / "honest")
    (tmp_path / "cases.txt").write_text(CPU_CASES)
    proc = _grade(root, tmp_path)
    status = lambda: {n: json.loads((out / f"{n}.json").read_text())["status"] for n in ("stats_user", "honest")}
    # no Triton on this machine: the machine's fault, never the student's (CI installs it); the
    # run then exits 4 (an entry with no final verdict); a pending review is final (0)
    honest = "pass" if importlib.util.find_spec("triton") else "environment_error"
    code = 0 if honest == "pass" else 4
    assert proc.returncode == code, proc.stderr[-3000:]
    assert status() == {"stats_user": "review", "honest": honest}, proc.stdout[-3000:]
    graded = json.loads((out / "stats_user.json").read_text())
    assert any("statistics" in line for line in graded["review"]), graded["review"]
    assert "1 submission waits for an instructor's review" in proc.stdout
    summary = lambda: json.loads((out / "_summary.json").read_text())
    assert [(e["id"], e["pending"]) for e in summary()["review"]] == [("stats_user", True)]
    page = (out / "leaderboard.html").read_text()
    assert 'id="review-stats_user"' in page and MARKER in page     # its source, for instructors
    assert MARKER not in (out / "leaderboard-students.html").read_text()
    assert "not a cheating verdict" in (out / "feedback" / "stats_user.md").read_text()

    decided = subprocess.run(
        [make, "-o", "env", "review", f"RESULTS={out}"], capture_output=True, text=True,
        cwd=config.REPO_ROOT, timeout=300,
        env={**os.environ, "ID": "stats_user", "DECISION": "cleared",
             "NOTE": 'statistics.fmean on a constant: "harmless"'})
    assert decided.returncode == 0, decided.stderr[-3000:]
    rows = lambda: {r["id"]: r["status"] for r in summary()["rows"]}
    assert rows()["stats_user"] == "pass" and summary()["review"][0]["decision"]["decision"] == CLEARED
    assert 'statistics.fmean on a constant: "harmless"' in (out / "feedback" / "stats_user.md").read_text()
    assert "Waiting for" not in (out / "feedback" / "stats_user.md").read_text()

    proc = _grade(root, tmp_path, "--force", "--only", "stats_user")   # the same source, again
    assert proc.returncode == code, proc.stderr[-3000:]
    assert status()["stats_user"] == "review"    # the grader's verdict; the decision holds on it
    assert rows()["stats_user"] == "pass" and not summary()["review"][0]["stale"]
    assert "waits for an instructor" not in proc.stdout
    # grades.csv, as a run that writes grades renders it (a CPU run writes none: it did not
    # check correctness on the GPU): the same results, the run file saying it had a GPU
    gpu = tmp_path / "as_gpu"
    shutil.copytree(out, gpu)
    run = json.loads((gpu / RUN_FILE).read_text())
    run["device"]["cuda"] = True
    (gpu / RUN_FILE).write_text(json.dumps(run))
    assert main(["leaderboard", "--out", str(gpu)]) == 0
    assert grades(gpu)["stats_user"]["status"] == "pass" and grades(gpu)["honest"]["status"] == honest

    with open(root / "stats_user" / "submission.py", "a") as f:   # the student changes it
        f.write("# a second version\n")
    proc = _grade(root, tmp_path)
    assert proc.returncode == code, proc.stderr[-3000:]
    assert rows()["stats_user"] == "review"
    [entry] = summary()["review"]
    assert entry["stale"] and entry["pending"] and entry["decision"]["decision"] == CLEARED
    assert "STALE: cleared" in (out / "leaderboard.html").read_text()
    assert "1 submission waits for an instructor's review" in proc.stdout

"""Grading over the check service's store (issue 33, "one truth", grader/course/service_drop.py):
each student's counted upload (best or last) unpacked as a drop's folder, checks never counted,
uploads after the deadline and damaged ones said, and `python -m grader grade <store>` writing
the results folder a drop gives."""

from __future__ import annotations

import datetime
import hashlib
import io
import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from grader.common import config
from grader.common.status import Status
from grader.course import service_drop
from grader.course.intake import DropError, open_drop
from grader.course.policy import Policy
from grader.course.results import SubmissionResult
from grader.course.roster import load_roster
from grader.course.submission import Kind
from grader.course.verdicts import CaseResult, TimingStats
from grader.service import store as store_mod
from grader.service.store import Store
from grader.service.tokens import issue
from tests.test_grade_cpu import CASES, EXPECTED, SUBMISSIONS

CORRECT = textwrap.dedent(SUBMISSIONS["correct"])   # right (numpy: graded, sent to review)
WRONG = textwrap.dedent(SUBMISSIONS["zeros"])       # a mismatch


def zipped(files: dict[str, str]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in files.items():
            z.writestr(name, text)
    return out.getvalue()


def stored_result(folder: str, status: Status, median_ms: float | None) -> str:
    """A result as the worker stores it (SubmissionResult.to_dict's JSON)."""
    timing = None if median_ms is None else TimingStats(
        n=100, median_ms=median_ms, mean_ms=median_ms * 1.01, min_ms=median_ms * 0.98, std_ms=0.01,
        rse=0.001, tflops=12.5, warmup_calls=5, budget_s=2.0, stopped_by="rse", wall_s=0.4)
    case = CaseResult(case="b1_h2_s77_d64", status=Status.PASS if status is Status.PASS else status)
    return json.dumps(SubmissionResult(
        id=folder, label=folder, kind="python", role="student", status=status,
        message="all 1 cases pass" if status is Status.PASS else "mismatch on case b1_h2_s77_d64",
        cases=(case,), timed_case="b1_h2_s77_d64" if timing else None, timing=timing,
        graded_at="2026-11-27T10:00:00+00:00").to_dict())


@pytest.fixture
def store(tmp_path) -> Store:
    """A service store with tokens for alice, bob and carol (none of whom has uploaded yet)."""
    roster = tmp_path / "roster.csv"
    roster.write_text("folder,email\nalice,a@example.edu\nbob,b@example.edu\ncarol,c@example.edu\n")
    s = Store(tmp_path / "store")
    issue(s, load_roster(roster))
    yield s
    s.close()


def drop(store: Store, tmp_path: Path, counts: str, **policy):
    return open_drop(store.folder, scratch=tmp_path / "scratch",
                     policy=Policy(service_counts=counts, **policy))


def by_id(d) -> dict:
    return {s.id: s for s in d.submissions}


def files_of(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_store_names_are_the_services():
    # grader.course reads the store below grader.service, by the same file names
    assert (service_drop.DB_FILE, service_drop.UPLOADS) == (store_mod.DB_FILE, store_mod.UPLOADS)


def test_best_counts_the_fastest_pass_and_last_the_latest_upload_graded_or_not(store, tmp_path):
    fast = store.accept("alice", "submission", zipped({"alice/submission.py": CORRECT}))
    slow = store.accept("alice", "submission", zipped({"submission.py": CORRECT + "# slower\n"}))
    failed = store.accept("alice", "submission", zipped({"submission.py": WRONG}))
    waiting = store.accept("alice", "submission", zipped({"submission.py": WRONG + "# v4\n"}))
    store.accept("alice", "check", zipped({"submission.py": "# a check never counts\n" + CORRECT}))
    store.finish(fast.id, stored_result("alice", Status.PASS, 1.5))
    store.finish(slow.id, stored_result("alice", Status.PASS, 2.5))
    store.finish(failed.id, stored_result("alice", Status.MISMATCH, None))
    # bob: nothing graded yet; best falls back to his last upload
    store.accept("bob", "submission", zipped({"submission.py": WRONG}))
    bob_last = store.accept("bob", "submission", zipped({"bob/submission.py": CORRECT}))

    best = drop(store, tmp_path / "best", "best")
    assert best.layout == "service" and sorted(by_id(best)) == ["alice", "bob"]   # carol sent none
    assert files_of(by_id(best)["alice"].path) == {"submission.py": CORRECT}
    assert by_id(best)["alice"].path.name == "alice"   # the zip's one top folder
    assert by_id(best)["alice"].path.parent.name == "alice"   # under the roster folder's name
    assert files_of(by_id(best)["bob"].path) == {"submission.py": CORRECT}
    assert all(s.kind is Kind.PYTHON for s in best.submissions) and best.skipped == ()
    assert "2 student(s) from the service store" in best.summary and "best" in best.summary

    chosen = service_drop.open_service_drop(store.folder, scratch=tmp_path / "s",
                                            policy=Policy(service_counts="best")).chosen
    assert (chosen["alice"].id, chosen["bob"].id) == (fast.id, bob_last.id)
    last = drop(store, tmp_path / "last", "last")
    assert files_of(by_id(last)["alice"].path) == {"submission.py": WRONG + "# v4\n"}
    assert files_of(by_id(last)["bob"].path) == {"submission.py": CORRECT}
    assert "last" in last.summary

    uploads = service_drop.read_store(store.folder)
    alice = [u for u in uploads if u.folder == "alice"]
    assert [u.id for u in alice] == [fast.id, slow.id, failed.id, waiting.id]   # no check
    assert service_drop.counted(alice, "best").id == fast.id
    assert service_drop.counted(alice, "last").id == waiting.id
    assert service_drop.counted(alice[1:], "best").id == slow.id
    assert service_drop.counted(alice[2:], "best").id == waiting.id   # none passed: the last
    with pytest.raises(ValueError, match="one of best, last"):
        service_drop.counted(alice, "first")


def test_best_skips_a_pass_waiting_on_review_and_ties_go_to_the_earlier(store, tmp_path):
    first = store.accept("alice", "submission", zipped({"submission.py": CORRECT}))
    tie = store.accept("alice", "submission", zipped({"submission.py": CORRECT + "# tie\n"}))
    review = store.accept("alice", "submission", zipped({"submission.py": CORRECT + "# np\n"}))
    store.finish(first.id, stored_result("alice", Status.PASS, 2.0))
    store.finish(tie.id, stored_result("alice", Status.PASS, 2.0))
    store.finish(review.id, stored_result("alice", Status.REVIEW, 0.5))   # not ranked until cleared
    uploads = service_drop.read_store(store.folder)
    assert service_drop.counted(uploads, "best").id == first.id
    store.finish(first.id, "{not json")   # an unreadable result is never ranked
    assert service_drop.counted(service_drop.read_store(store.folder), "best").id == tie.id


def test_uploads_after_the_deadline_are_skipped_and_said(store, tmp_path):
    on_time = store.accept("alice", "submission", zipped({"submission.py": CORRECT}))
    late = store.accept("alice", "submission", zipped({"submission.py": WRONG}))
    deadline = datetime.datetime.fromisoformat(on_time.received_at)
    assert datetime.datetime.fromisoformat(late.received_at) > deadline
    d = drop(store, tmp_path, "last", service_deadline=deadline)
    assert files_of(by_id(d)["alice"].path) == {"submission.py": CORRECT}
    assert [s.entry for s in d.skipped] == [f"uploads/{late.id}"]
    assert "after the deadline" in d.skipped[0].reason and "alice" in d.skipped[0].reason
    assert "1 upload(s) skipped, received after the deadline" in d.summary


def test_a_damaged_or_missing_upload_is_that_students_row_and_the_others_are_graded(store, tmp_path):
    alice = store.accept("alice", "submission", zipped({"submission.py": CORRECT}))
    bob = store.accept("bob", "submission", zipped({"submission.py": CORRECT}))
    carol = store.accept("carol", "submission", zipped({"submission.py": CORRECT}))
    data = bytearray(alice.upload.read_bytes())
    data[-10] ^= 0xFF
    alice.upload.write_bytes(bytes(data))
    bob.upload.unlink()
    d = drop(store, tmp_path, "last")
    subs = by_id(d)
    assert subs["alice"].kind is Kind.INVALID and "damaged" in subs["alice"].problem
    assert subs["alice"].machine_fault   # environment_error: the store's fault, not a grade
    assert "digest recorded when it was accepted" in subs["alice"].problem
    assert subs["bob"].kind is Kind.INVALID and "missing from the service's store" in subs["bob"].problem
    assert subs["carol"].kind is Kind.PYTHON
    assert "2 student(s)' counted upload unusable" in d.summary
    assert f"uploads/{alice.id}" in subs["alice"].problem and str(tmp_path) not in subs["alice"].problem
    carol.upload.write_bytes(b"\0" * 10)   # no student gradable: the run stops, each one listed
    with pytest.raises(DropError, match=r"no gradable submission(.|\n)*alice: (.|\n)*carol: "):
        drop(store, tmp_path, "last")


def test_an_upload_that_breaks_the_drops_rules_is_refused_with_the_rule(store, tmp_path):
    bad = zipped({"../evil.py": "x", "submission.py": CORRECT})   # the service would refuse it
    job = store.accept("alice", "submission", bad)
    store.accept("bob", "submission", zipped({"submission.py": CORRECT}))
    subs = by_id(drop(store, tmp_path, "last"))
    assert subs["alice"].kind is Kind.INVALID and "leaves its folder" in subs["alice"].problem
    assert job.id[:12] in subs["alice"].problem
    assert not (tmp_path / "evil.py").exists() and subs["bob"].kind is Kind.PYTHON


def test_the_store_is_only_read_and_an_unreadable_one_is_a_clear_error(store, tmp_path):
    store.accept("alice", "submission", zipped({"submission.py": CORRECT}))
    db = store.folder / service_drop.DB_FILE
    before = store.jobs_of("alice")
    audit = store.audit_log()
    drop(store, tmp_path, "best")
    assert store.jobs_of("alice") == before and store.audit_log() == audit
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / service_drop.DB_FILE).write_bytes(b"this is not a database" * 100)
    with pytest.raises(DropError, match=r"cannot be read as a service store.*serve --store"):
        open_drop(broken, scratch=tmp_path / "s2", policy=Policy())
    assert db.is_file()
    with store._write() as conn:   # a row edited by hand
        conn.execute("UPDATE submissions SET received_at = 'yesterday'")
    with pytest.raises(DropError, match=r"received_at 'yesterday', not a date and time"):
        drop(store, tmp_path, "best")


def test_grade_over_the_store_writes_the_results_folder_a_drop_gives(store, tmp_path):
    """The real command: alice's best (a right one graded earlier) and bob's only upload."""
    right = store.accept("alice", "submission", zipped({"alice/submission.py": CORRECT}))
    store.accept("alice", "submission", zipped({"submission.py": WRONG + "# later\n"}))
    store.finish(right.id, stored_result("alice", Status.PASS, 1.0))
    store.accept("bob", "submission", zipped({"submission.py": WRONG}))
    store.accept("bob", "check", zipped({"submission.py": CORRECT}))
    cases = tmp_path / "cases.txt"
    cases.write_text(CASES.splitlines()[0] + "\n")
    out = tmp_path / "results"
    env = {**os.environ, "GRADER_RUN_S": "60"}
    proc = subprocess.run(
        [sys.executable, "-m", "grader", "grade", str(store.folder), "--out", str(out),
         "--no-baselines", "--no-solution", "--cpu", "--cases", str(cases), "--no-hidden",
         "--build-dir", str(tmp_path / "build")],
        capture_output=True, text=True, cwd=config.REPO_ROOT, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 student(s) from the service store" in proc.stderr and "best" in proc.stderr
    run = json.loads((out / "_run.json").read_text())
    assert run["submissions"] == ["alice", "bob"] and run["skipped"] == []
    got = {name: json.loads((out / f"{name}.json").read_text())["status"] for name in ("alice", "bob")}
    assert got == {"alice": EXPECTED["correct"], "bob": EXPECTED["zeros"]}
    assert (out / "leaderboard.html").is_file() and (out / "feedback" / "bob.md").is_file()
    graded = (tmp_path / "build" / config.DROP_SCRATCH / "service" / "bob" / "submission.py")
    assert hashlib.sha256(graded.read_bytes()).hexdigest() == hashlib.sha256(WRONG.encode()).hexdigest()


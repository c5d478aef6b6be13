"""The check service's store and tokens (issue 33, grader/service/): tokens by digest, revoked at
once; one service per store; nothing accepted is lost to a kill -9; a queue fair across students."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from grader.course.roster import load_roster
from grader.service import tokens as tokens_mod
from grader.service.store import Store, StoreBusy, round_robin
from grader.service.tokens import TokenError, issue, read_tokens, revoke

REPO = Path(__file__).resolve().parents[1]


def roster(tmp_path: Path, *folders: str):
    path = tmp_path / "roster.csv"
    path.write_text("folder,email\n" + "".join(f"{f},{f}@example.edu\n" for f in folders))
    return load_roster(path)


def test_each_roster_student_gets_a_token_kept_by_digest_and_a_rerun_keeps_them(tmp_path):
    store = Store(tmp_path / "store")
    done = issue(store, roster(tmp_path, "alice", "bob"))
    assert sorted(done.new) == ["alice", "bob"] and done.instructor_new
    written = read_tokens(store)
    assert sorted(written) == ["alice", "bob"] and len(set(written.values())) == 2
    for name in ("tokens.csv", "instructor.token"):
        assert stat.S_IMODE((store.folder / name).stat().st_mode) == 0o600
    db = (store.folder / "service.sqlite3").read_bytes()
    assert all(token.encode() not in db for token in written.values())   # digests only
    who, why = store.identify(written["alice"])
    assert who.folder == "alice" and not who.instructor and why == ""
    boss, _ = store.identify((store.folder / "instructor.token").read_text().strip())
    assert boss.instructor
    again = issue(store, roster(tmp_path, "alice", "bob", "carol"))
    assert again.new == ("carol",) and sorted(again.kept) == ["alice", "bob"]
    assert not again.instructor_new
    assert read_tokens(store)["alice"] == written["alice"]
    assert store.identify("not-a-token") == (None, "unknown")


def test_a_revoked_token_stops_at_once_and_a_reissued_one_replaces_it(tmp_path):
    store = Store(tmp_path / "store")
    issue(store, roster(tmp_path, "alice", "bob"))
    old = read_tokens(store)["alice"]
    assert revoke(store, "alice") is None
    assert store.identify(old) == (None, "revoked") and "alice" not in read_tokens(store)
    with pytest.raises(TokenError, match="no token to revoke"):
        revoke(store, "nobody")
    new = tokens_mod.revoke(store, "bob", reissue=True)
    assert store.identify(new)[0].folder == "bob" and read_tokens(store)["bob"] == new
    # a rerun gives alice a new token (hers was revoked) and keeps bob's reissued one
    again = issue(store, roster(tmp_path, "alice", "bob"))
    assert again.new == ("alice",) and read_tokens(store)["bob"] == new


def test_an_edited_tokens_file_is_refused_with_its_line(tmp_path):
    store = Store(tmp_path / "store")
    issue(store, roster(tmp_path, "alice"))
    path = store.folder / "tokens.csv"
    path.write_text(path.read_text() + "bob\n")
    with pytest.raises(TokenError, match=r"tokens.csv, line 3: expected 'folder,token'"):
        issue(store, roster(tmp_path, "alice", "bob"))


def test_a_second_service_on_one_store_is_refused_and_a_killed_one_leaves_no_lock(tmp_path):
    folder = tmp_path / "store"
    first = Store(folder)
    first.lock()
    with pytest.raises(StoreBusy, match=rf"pid {os.getpid()}.*--store"):
        Store(folder).lock()
    first.close()
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from grader.service.store import Store
        Store({str(folder)!r}).lock()
        print("locked", flush=True)
        time.sleep(600)
        """)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(StoreBusy, match=f"pid {holder.pid}"):
        Store(folder).lock()
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    Store(folder).lock()   # the kernel let the lock go with the killed process


KILLED_MID_QUEUE = """
import sys
sys.path.insert(0, {repo!r})
from grader.service.store import Store
store = Store({folder!r})
store.lock()
ids = [store.accept(f"s{{i % 3}}", "submission", b"zip bytes %d" % i).id for i in range(6)]
running = store.take()
print(" ".join(ids), running.id, flush=True)
(store.folder / "uploads" / "orphan").write_bytes(b"never accepted")
import time
time.sleep(600)
"""


def test_kill_9_mid_queue_loses_no_accepted_upload_and_requeues_the_running_one(tmp_path):
    folder = tmp_path / "store"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_MID_QUEUE.format(repo=str(REPO),
                                                                          folder=str(folder))],
                            stdout=subprocess.PIPE, text=True)
    *accepted, running = proc.stdout.readline().split()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    store = Store(folder)
    store.lock()
    assert store.recover() == [running]
    assert not (folder / "uploads" / "orphan").exists()
    for i, job_id in enumerate(accepted):
        job = store.job(job_id)
        assert job.state == "queued" and job.upload.read_bytes() == b"zip bytes %d" % i
    assert store.job(running).attempts == 1
    # every accepted job then runs to its end
    done = []
    while (job := store.take()) is not None:
        store.finish(job.id, '{"status": "pass"}')
        done.append(job.id)
    assert sorted(done) == sorted(accepted)
    assert all(store.job(j).state == "done" for j in accepted)


def test_the_queue_is_round_robin_by_student(tmp_path):
    store = Store(tmp_path / "store")
    flood = [store.accept("alice", "check", b"a%d" % i).id for i in range(4)]
    bob = store.accept("bob", "check", b"b").id
    carol = store.accept("carol", "submission", b"c").id
    assert store.queue_order() == [flood[0], bob, carol, flood[1], flood[2], flood[3]]
    assert store.position(carol) == 3 and store.position("nope") is None
    assert store.take().id == flood[0]
    time.sleep(0.01)
    # alice just had her turn: bob and carol, who never had one, go first
    assert store.queue_order()[:2] == [bob, carol]
    count, first = store.count_since("alice", "check", "")
    assert count == 4 and first == store.job(flood[0]).received_at
    assert store.count_since("alice", "submission", "") == (0, None)
    assert round_robin([], {}) == []


def test_every_attempt_is_audited(tmp_path):
    store = Store(tmp_path / "store")
    store.audit("alice", "submit", "refused", "429: 10 checks in the last hour", "127.0.0.1")
    store.audit("", "submit", "refused", "401: unknown token", "10.0.0.9")
    log = store.audit_log()
    assert [row[1:4] for row in log] == [("", "submit", "refused"), ("alice", "submit", "refused")]
    assert log[0][5] == "10.0.0.9"


def _grader(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grader", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300)


def test_serve_tokens_from_the_command_line(tmp_path):
    """`python -m grader serve tokens`: issue from the roster, revoke and reissue one student,
    and a clear error for what cannot be done."""
    store = tmp_path / "store"
    roster(tmp_path, "alice", "bob")
    done = _grader("serve", "tokens", "--roster", str(tmp_path / "roster.csv"), "--store", str(store))
    assert done.returncode == 0, done.stderr
    assert "2 new token(s), 0 kept" in done.stdout and "instructor.token" in done.stdout
    first = read_tokens(Store(store))
    again = _grader("serve", "tokens", "--revoke", "bob", "--reissue", "--store", str(store))
    assert again.returncode == 0 and "stops working now" in again.stdout
    now = read_tokens(Store(store))
    assert now["alice"] == first["alice"] and now["bob"] != first["bob"]
    assert Store(store).identify(first["bob"]) == (None, "revoked")
    for args, said in [(("--revoke", "nobody"), "'nobody' has no token to revoke"),
                       (("--reissue",), "--reissue goes with --revoke"),
                       ((), "give --roster roster.csv"),
                       (("--roster", str(tmp_path / "none.csv")), "none.csv")]:
        failed = _grader("serve", "tokens", "--store", str(store), *args)
        assert failed.returncode == 2 and said in failed.stderr, (args, failed.stderr)


def test_a_batch_is_the_queue_s_next_job_and_every_later_one_of_its_kind(tmp_path):
    """Store.take_batch: a check queued between two students' submissions does not cut the
    submissions' batch short (each batch pays a grading run's fixed costs); the jobs passed over
    keep their places and make the next batch; one job per student; at most `limit`."""
    store = Store(tmp_path / "store")
    carol = store.accept("carol", "submission", b"PK\x03\x04c")
    alice = store.accept("alice", "check", b"PK\x03\x04a")
    bob = store.accept("bob", "submission", b"PK\x03\x04b")
    carol2 = store.accept("carol", "submission", b"PK\x03\x04c2")
    dave = store.accept("dave", "check", b"PK\x03\x04d")
    erin = store.accept("erin", "submission", b"PK\x03\x04e")
    first = store.take_batch(2)
    assert [j.id for j in first] == [carol.id, bob.id]
    assert all(j.state == "running" and j.attempts == 1 for j in first)
    assert store.queue_order()[:2] == [alice.id, dave.id]   # passed over, still first in line
    assert [j.id for j in store.take_batch(8)] == [alice.id, dave.id]
    assert [j.id for j in store.take_batch(8)] == [erin.id, carol2.id]
    assert store.take_batch(8) == []


def test_a_job_whose_run_failed_is_graded_alone(tmp_path):
    """The attack twin of batching: a submission that breaks its grading run fails the whole
    batch once; every job of it that was tried is then graded alone, so that the breaker uses up
    its own attempts only, and the others are graded."""
    store = Store(tmp_path / "store")
    jobs = [store.accept(f"s{i}", "submission", b"PK\x03\x04%d" % i) for i in range(3)]
    fresh = store.accept("s3", "submission", b"PK\x03\x04x")
    first = store.take_batch(3)
    assert [j.id for j in first] == [j.id for j in jobs[:3]]
    for job in first:   # the run failed: each one's attempt counted
        store.requeue(job.id)
    # the fresh one first (never started), alone: the tried ones join no batch
    batches = [[j.id for j in store.take_batch(8)] for _ in range(5)]
    assert batches == [[fresh.id], [jobs[0].id], [jobs[1].id], [jobs[2].id], []]

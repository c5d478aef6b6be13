"""The service's grading worker (issue 33, grader/service/worker.py), in this process over a real
store: a check and a submission graded by `make grade`'s own pipeline (serve's GradeFn, Python
submissions on the CPU) end done with its verdict, a check on the public cases only and a
submission on every case; what a student is shown of it names no hidden case; a grader that
raises is tried MAX_ATTEMPTS times, then the job ends environment_error; a job a killed service
held that many times ends the same way; a clean stop queues the job again, uncounted."""

from __future__ import annotations

import json
import textwrap
import threading
from pathlib import Path

import pytest

from grader.cli.main import parser
from grader.cli.serve import pipeline
from grader.course.roster import load_roster
from grader.service.store import Store
from grader.service.tokens import issue
from grader.service.worker import (MAX_ATTEMPTS, RUN_CASES, GradingFailed, MachineBusy, Worker,
                                   student_view)

from .test_service_uploads import zipped

NUMPY_CORRECT = textwrap.dedent("""
    import numpy as np
    import torch

    def custom_kernel(data):
        q, k, v = (t.detach().cpu().float().numpy() for t in data)
        s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
        p = np.exp(s - s.max(-1, keepdims=True))
        return torch.from_numpy(p / p.sum(-1, keepdims=True) @ v).half().to(data[0].device)
""").encode()
ZEROS = b"import torch\ndef custom_kernel(data):\n    return torch.zeros_like(data[0])\n"
PUBLIC = ("batch_size: 1; num_heads: 2; seq_len: 1; head_dim: 64; seed: 1\n"
          "batch_size: 1; num_heads: 2; seq_len: 33; head_dim: 64; seed: 2\n")
HIDDEN = "batch_size: 1; num_heads: 3; seq_len: 71; head_dim: 64; seed: 909\n"
HIDDEN_ID = "b1_h3_s71_d64"


def setup_store(tmp_path: Path) -> tuple[Store, list[str]]:
    """A store with alice's and bob's tokens, small public and hidden case files, and serve's
    command line over them (its --cpu: this machine's CPU grades)."""
    roster = tmp_path / "roster.csv"
    roster.write_text("folder\nalice\nbob\n")
    store = Store(tmp_path / "store")
    issue(store, load_roster(roster))
    (tmp_path / "public.txt").write_text(PUBLIC)
    (tmp_path / "hidden.txt").write_text(HIDDEN)
    argv = ["serve", "--roster", str(roster), "--store", str(store.folder), "--cpu",
            "--cases", str(tmp_path / "public.txt"), "--hidden", str(tmp_path / "hidden.txt")]
    return store, argv


def quiet_worker(store: Store, grade, **kw) -> tuple[Worker, list[str]]:
    said: list[str] = []
    return Worker(store, grade, log=said.append, retry_s=0, poll_s=0.05, **kw), said


@pytest.mark.slow   # two runs of the whole grader on the CPU
def test_a_check_and_a_submission_end_done_with_the_pipelines_verdict(tmp_path):
    store, argv = setup_store(tmp_path)
    check = store.accept("alice", "check", zipped({"alice-kit/submission.py": ZEROS}))
    sub = store.accept("bob", "submission", zipped({"submission.py": NUMPY_CORRECT}))
    worker, said = quiet_worker(store, pipeline(parser().parse_args(argv)))
    assert worker.run_once() and worker.run_once() and not worker.run_once()

    done = {j: store.job(j) for j in (check.id, sub.id)}
    assert all(j.state == "done" for j in done.values()), said
    checked, graded = (json.loads(done[j].result) for j in (check.id, sub.id))
    assert checked["id"] == "alice" and checked["status"] == "mismatch"   # all zeros
    # numpy does the math: right, but the audit sends it to review (as make grade does)
    assert graded["id"] == "bob" and graded["status"] == "review", graded["message"]
    # a check: the public cases (and, without a GPU, the small CPU cases), never a hidden one
    assert not any(c["hidden"] for c in checked["cases"])
    assert {"b1_h2_s1_d64", "b1_h2_s33_d64"} <= {c["case"] for c in checked["cases"]}
    # a submission: every case, the hidden one too; the instructor's stored result names it
    assert [c["case"] for c in graded["cases"] if c["hidden"]] == [HIDDEN_ID]
    assert any(c["id"] == HIDDEN_ID and "seed: 909" in c["line"] for c in graded[RUN_CASES])
    # each batch a folder of its own: the unpacked upload, the results as make grade writes them
    assert (store.folder / "work" / check.id / "alice" / "submission.py").read_bytes() == ZEROS
    assert (store.folder / "work" / sub.id / "results" / "bob.json").is_file()
    assert not (store.folder / "work" / sub.id / "build").exists()

    view = student_view(done[sub.id].result)
    text = json.dumps(view)
    assert view["status"] == "review" and view["hidden_cases"] == dict(of=1, ran=1, passed=1)
    assert HIDDEN_ID not in text and RUN_CASES not in view
    assert "seed: 909" not in text and "seq_len: 71" not in text and "s71" not in text
    assert not any(c["hidden"] for c in view["cases"])
    assert "REVIEW" in view["feedback"].upper() and str(tmp_path) not in text


class Exploding:
    def __init__(self):
        self.calls = 0

    def __call__(self, jobs, early=None):
        self.calls += 1
        raise GradingFailed(f"the GPU fell off the bus (call {self.calls})")


def test_a_grader_that_raises_is_retried_then_the_job_ends_environment_error(tmp_path):
    store, _ = setup_store(tmp_path)
    job = store.accept("alice", "submission", zipped({"submission.py": ZEROS}))
    grade = Exploding()
    worker, said = quiet_worker(store, grade)
    for attempt in range(1, MAX_ATTEMPTS):
        assert worker.run_once()
        again = store.job(job.id)
        assert again.state == "queued" and again.attempts == attempt and again.result is None
    assert worker.run_once()
    done = store.job(job.id)
    assert grade.calls == MAX_ATTEMPTS and done.state == "done" and done.attempts == MAX_ATTEMPTS
    result = json.loads(done.result)
    assert result["status"] == "environment_error" and result["id"] == "alice"
    assert f"failed {MAX_ATTEMPTS} times" in result["message"] and "not your fault" in \
        result["message"]
    assert "fell off the bus (call 3)" in result["notes"][0]
    assert result["kind"] == "python"
    assert student_view(done.result)["status"] == "environment_error"
    assert any("environment_error" in line for line in said)


def test_a_busy_gpu_makes_the_job_wait_without_counting_the_attempt(tmp_path):
    store, _ = setup_store(tmp_path)
    job = store.accept("alice", "submission", zipped({"submission.py": ZEROS}))

    def busy(jobs, early=None):
        raise MachineBusy("the GPU 0 is held by pid 4242: python -m grader grade course")

    worker, said = quiet_worker(store, busy)
    for _ in range(MAX_ATTEMPTS + 2):
        assert worker.run_once()
    again = store.job(job.id)
    assert again.state == "queued" and again.attempts == 0 and again.result is None
    assert worker._retry and any("held by pid 4242" in line for line in said)


def test_a_job_a_killed_service_held_too_often_ends_environment_error(tmp_path):
    store, _ = setup_store(tmp_path)
    job = store.accept("bob", "check", zipped({"submission.py": ZEROS}))
    for _ in range(MAX_ATTEMPTS):   # taken, then the service killed: recover queues it again
        assert store.take().id == job.id
        assert store.recover() == [job.id]
    grade = Exploding()
    worker, _ = quiet_worker(store, grade)
    assert worker.run_once() and grade.calls == 0
    result = json.loads(store.job(job.id).result)
    assert result["status"] == "environment_error"
    assert f"stopped while grading it {MAX_ATTEMPTS} times" in result["notes"][0]


def test_a_clean_stop_queues_the_job_again_without_counting_it(tmp_path):
    store, _ = setup_store(tmp_path)
    job = store.accept("alice", "check", zipped({"submission.py": ZEROS}))
    entered, release = threading.Event(), threading.Event()

    def slow(jobs, early=None):   # a run that stops when the service does (procs.cancel_all, here an event)
        entered.set()
        release.wait(60)
        raise GradingFailed("interrupted")

    worker, _ = quiet_worker(store, slow)
    worker.start()
    assert entered.wait(60)
    assert store.job(job.id).state == "running"
    worker.stopping.set()
    release.set()
    assert worker.stop(timeout=60)
    again = store.job(job.id)
    assert again.state == "queued" and again.attempts == 0 and again.result is None


def test_a_batch_takes_one_kind_and_one_job_per_student(tmp_path):
    store, _ = setup_store(tmp_path)
    a1 = store.accept("alice", "check", zipped({"submission.py": ZEROS}))
    a2 = store.accept("alice", "check", zipped({"submission.py": ZEROS}))
    b1 = store.accept("bob", "submission", zipped({"submission.py": ZEROS}))
    batches = []

    def record(jobs, early=None):
        batches.append([(j.id, j.kind, j.student) for j in jobs])
        assert all(j.folder.name == j.student and (j.folder / "submission.py").is_file()
                   for j in jobs)
        raise GradingFailed("recorded")

    worker, _ = quiet_worker(store, record, slots=4)
    assert worker.run_once()
    # round robin: alice's first, then bob's (another kind: it waits for the next batch)
    assert batches == [[(a1.id, "check", "alice")]]
    assert store.job(b1.id).state == "queued" and store.job(b1.id).attempts == 0
    assert worker.run_once()
    assert batches[1] == [(b1.id, "submission", "bob")]
    assert worker.run_once()
    assert batches[2][0][0] in (a1.id, a2.id)


def test_a_result_said_early_is_stored_at_once_and_survives_the_batch_failing(tmp_path):
    """A batch's first result is the student's as soon as the run writes it (`early`), while the
    batch's other jobs are graded; a run that then fails tries again only the jobs not done. A
    result the machine may still grade again (environment_error) is not taken early."""
    from grader.common.status import Status
    from grader.course.results import SubmissionResult
    from grader.service.worker import Graded
    store, _ = setup_store(tmp_path)
    a = store.accept("alice", "submission", zipped({"submission.py": ZEROS}))
    b = store.accept("bob", "submission", zipped({"submission.py": ZEROS}))
    seen = {}

    def result(student: str, status: Status) -> Graded:
        return Graded(SubmissionResult(id=student, label=student, kind="python", role="student",
                                       status=status, message=status.value), [])

    def grade(jobs, early=None):
        by_student = {j.student: j.id for j in jobs}
        early(by_student["alice"], result("alice", Status.MISMATCH))
        seen["alice"] = store.job(a.id).state   # done before the batch ends
        early(by_student["bob"], result("bob", Status.ENVIRONMENT_ERROR))
        seen["bob"] = store.job(b.id).state
        raise GradingFailed("the GPU fell off the bus")

    worker, said = quiet_worker(store, grade, slots=1)
    assert worker.run_once()
    assert seen == dict(alice="done", bob="running")
    assert json.loads(store.job(a.id).result)["status"] == "mismatch"
    again = store.job(b.id)
    assert again.state == "queued" and again.attempts == 1 and again.result is None, said


def test_an_earlier_attempts_results_are_never_taken_for_a_job(tmp_path, monkeypatch):
    """A batch graded again (its run stopped or failed) may have the same results folder as its
    earlier attempt: what that attempt wrote (a subject killed by the stop: a runtime_error) is
    gone before the new run starts, so the results watcher cannot take it for the job."""
    import time as clock
    from grader.cli import serve as serve_cli
    from grader.common.status import Status
    from grader.course.results import SubmissionResult, write_result
    from grader.service.worker import GradeJob
    _, argv = setup_store(tmp_path)
    folder = tmp_path / "work" / "alice"
    folder.mkdir(parents=True)
    (folder / "submission.py").write_bytes(ZEROS)
    out = tmp_path / "work" / "results"
    out.mkdir()
    stale = SubmissionResult(id="alice", label="alice", kind="python", role="student",
                             status=Status.RUNTIME_ERROR, message="killed by the stop")
    roster = [dict(id="alice", result=write_result(out, stale).name)]
    (out / "_run.json").write_text(json.dumps(dict(device={}, cases=[], roster=roster)))
    taken = []

    def run(subs, *, out, args, baselines, quiet):   # stands in for make grade's run
        assert not any(out.iterdir()), list(out.iterdir())
        clock.sleep(2.5)   # longer than the watcher's look (every 2 s)
        (out / "_run.json").write_text(json.dumps(dict(device={}, cases=[], roster=[])))
        return 0

    monkeypatch.setattr(serve_cli, "_grade", run)
    job = GradeJob("j1", "check", "alice", folder, out, tmp_path / "work" / "build")
    assert serve_cli.pipeline(parser().parse_args(argv))([job], lambda *a: taken.append(a)) == {}
    assert taken == []

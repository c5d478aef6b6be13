"""The service's grading worker (issue 33): accepted uploads taken from the store's queue, graded
through the course pipeline, their results stored.

What it guarantees:
- **one grading path**: the worker unpacks and hands jobs to a `GradeFn`; `serve` gives it the
  pipeline `make grade` runs (grader/cli/serve.py: the same sandbox, limits, trust boundary and
  review queue), a `check` on the public cases (not ranked), a `submission` on every case.
- **each job a folder of its own**: `STORE/work/<batch>/<student>/` (the upload, unpacked by the
  drop's rules: uploads.unpack_upload) and `STORE/work/<batch>/results/` (the run's results
  folder, logs and feedback as `make grade` writes them); <batch> is its first job's id.
- **nothing lost**: a job is `done` only once its result is stored (Store.finish). A grader
  error puts it back in the queue (the attempt counted); a killed service leaves it `running`,
  queued again at the next start (Store.recover). After MAX_ATTEMPTS attempts it is finished
  with an environment_error result saying so: the machine's fault, never a grade.
- **a clean stop** (Ctrl-C, SIGTERM: `stop`) kills the run's children, stores nothing of the
  interrupted run and queues its jobs again without counting the attempt.
- **several GPUs**: the pipeline grades one run per process, its submissions spread over the
  GPUs (schedule/workers.py), so the worker takes a batch of up to `slots` x BATCH_PER_SLOT jobs
  (Store.take_batch: the queue's next job and every later one of its kind from other students;
  the jobs passed over keep their places; a job whose run failed is graded alone after, so that
  one submission that breaks runs cannot use up its batch-mates' attempts). A run's fixed costs (the device's probe, the checker's references, the
  calibration) are paid once per batch, not per job.
- **each result as soon as it is final**: the GradeFn says when a job's result is written
  (`early`), and the job is done then, while the batch's later jobs are graded; a result the
  machine may still grade again (environment_error) waits for the run's end.

The stored result is the pipeline's SubmissionResult JSON with `run_cases` (the run file's case
list) added; `student_view` makes of it what a student may see (report/privacy.py).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from grader.common.status import Status
from grader.course.results import SubmissionResult
from grader.course.submission import Kind, inspect_folder
from grader.isolation import procs
from grader.report.feedback import feedback_text
from grader.report.privacy import Redactor
from grader.service.store import Job, Store, now
from grader.service.uploads import unpack_upload

WORK = "work"
MAX_ATTEMPTS = 3
POLL_S = 1.0
RETRY_S = 30.0   # after a failed attempt: the machine's trouble (a GPU another run holds) may pass
RUN_CASES = "run_cases"   # the stored result's extra key: the run file's cases (id, hidden, line)
# Jobs a batch takes per GPU (or Slurm task): a run's fixed costs are shared by them, and a student
# who submits while a batch runs waits for at most this many submissions per GPU before theirs.
BATCH_PER_SLOT = 16


class GradingFailed(RuntimeError):
    """The grading machine failed on a job (not the submission): it is tried again."""


class MachineBusy(GradingFailed):
    """Another run holds what the batch needs (a GPU `make grade` is using): its jobs wait,
    their attempts not counted, and are tried again after RETRY_S."""


@dataclasses.dataclass(frozen=True)
class GradeJob:
    """One job as a GradeFn gets it: its submission folder (named by the student's roster folder),
    unpacked, and the batch's results and build folders."""
    id: str
    kind: str          # 'check' or 'submission'
    student: str       # the roster folder: the submission's id in the run
    folder: Path
    out: Path
    build: Path


@dataclasses.dataclass(frozen=True)
class Graded:
    """A job's result and the cases of the run that graded it (the run file's `cases`)."""
    result: SubmissionResult
    run_cases: list[dict]


# Grades a batch (one kind, one job per student); returns each job's Graded by job id, and may say
# each one as soon as it is written (`early(job id, Graded)`, from any thread). Raises
# GradingFailed (or anything) when the run failed: every job of the batch not yet done is tried
# again. A job missing from the answer is tried again alone.
Early = Callable[[str, Graded], None]
GradeFn = Callable[[list[GradeJob], Early], dict[str, Graded]]


def stored_json(graded: Graded) -> str:
    return json.dumps({**graded.result.to_dict(), RUN_CASES: graded.run_cases}, allow_nan=True)


def student_view(result_json: str) -> dict:
    """A stored result as its student may see it: the students' page's view (report/privacy.py,
    hidden_detail=False: no hidden case's id, shape, seed or message; absolute paths cut), with
    the hidden cases as a count and `feedback`, the text `make check` prints."""
    data = json.loads(result_json)
    run_cases = data.pop(RUN_CASES, None) or [dict(id=c["case"], hidden=c.get("hidden", False))
                                              for c in data.get("cases", ())]
    result = SubmissionResult.from_dict(data)
    redactor = Redactor.for_run({"cases": run_cases})
    hidden = [c for c in result.cases if redactor.is_hidden(c)]
    hidden_ran = [c for c in hidden if c.status is not Status.NOT_RUN]
    shown = redactor.student_result(result, hidden_detail=False)
    view = shown.to_dict()
    view.pop("key", None)   # digests of the grader's inputs: the instructor's
    view["hidden_cases"] = dict(of=len(hidden), ran=len(hidden_ran),
                                passed=sum(c.status is Status.PASS for c in hidden_ran))
    view["feedback"] = feedback_text(shown)
    return view


def environment_error(job: Job, why: str) -> SubmissionResult:
    """The result of a job the machine failed MAX_ATTEMPTS times: not graded, not the student's."""
    return SubmissionResult(
        id=job.folder, label=job.folder, kind=_kind_of(job), role="student",
        status=Status.ENVIRONMENT_ERROR,
        message=(f"the grading service failed {MAX_ATTEMPTS} times on this {job.kind}: "
                 f"{Status.ENVIRONMENT_ERROR.description}"),
        notes=(f"last failure: {why}",), graded_at=now())


def _kind_of(job: Job) -> str:
    try:
        with tempfile.TemporaryDirectory() as tmp:
            return inspect_folder(unpack_upload(job.upload, Path(tmp) / job.folder),
                                  id=job.folder).kind.value
    except Exception:   # the upload is what failed: its kind is unknown
        return Kind.INVALID.value


class Worker:
    """Takes jobs from `store` and grades them with `grade`, in a thread of its own (`start`,
    `stop`), or one batch at a time (`run_once`, for tests and the thread's loop)."""

    def __init__(self, store: Store, grade: GradeFn, *, slots: int = 1, poll_s: float = POLL_S,
                 retry_s: float = RETRY_S, max_attempts: int = MAX_ATTEMPTS, log: Callable[[str], None] | None = None,
                 batch_per_slot: int = BATCH_PER_SLOT):
        self.store, self.grade, self.slots = store, grade, max(1, slots)
        self.batch_max = self.slots * max(1, batch_per_slot)
        self._done: set[str] = set()   # the running batch's jobs already finished (early)
        self._done_lock = threading.Lock()
        self.poll_s, self.retry_s, self.max_attempts = poll_s, retry_s, max_attempts
        self._retry = False   # an attempt failed: wait retry_s before the next batch
        self.log = log or (lambda line: print(f"service: {line}", file=sys.__stderr__, flush=True))
        self.work = store.folder / WORK
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the thread

    def start(self) -> threading.Thread:
        self._thread = threading.Thread(target=self._loop, name="grading-worker", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self, timeout: float = 60.0) -> bool:
        """Stop taking jobs, kill the grading run's children, wait for the thread; whether it
        ended (a job it held is queued again, or left running for the next start's recover)."""
        self.stopping.set()
        if self._thread is None:
            return True
        procs.cancel_all()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _loop(self) -> None:
        while not self.stopping.is_set():
            try:
                took = self.run_once()
            except Exception:   # the store itself failed: say so, wait, try again
                self.log("worker error (it goes on):\n" + traceback.format_exc())
                took = False
            if self._retry:
                self._retry = False
                self.stopping.wait(self.retry_s)
            elif not took:
                self.stopping.wait(self.poll_s)

    # ------------------------------------------------------------------ one batch

    def run_once(self) -> bool:
        """Take a batch and grade it; False when the queue was empty."""
        batch = self._take_batch()
        if not batch:
            return False
        ready = []
        for job in batch:
            if job.attempts > self.max_attempts:   # killed with it that many times
                self._give_up(job, f"the service stopped while grading it {job.attempts - 1} times")
            else:
                ready.append(job)
        if ready:
            self._grade(ready)
        return True

    def _take_batch(self) -> list[Job]:
        return [] if self.stopping.is_set() else self.store.take_batch(self.batch_max)

    def _grade(self, batch: list[Job]) -> None:
        root = self.work / batch[0].id
        out, build = root / "results", root / "build"
        jobs: dict[str, GradeJob] = {}
        started = time.monotonic()
        for job in batch:
            try:
                folder = unpack_upload(job.upload, root / job.folder)
            except Exception as e:   # checked when accepted: the machine's disk, or the rules changed
                self._failed(job, f"its upload could not be unpacked ({type(e).__name__}: {e})")
                continue
            jobs[job.id] = GradeJob(job.id, job.kind, job.folder, folder, out, build)
        if not jobs:
            return
        if self.stopping.is_set():
            return self._interrupted(batch)
        with self._done_lock:
            self._done = set()
        by_id = {job.id: job for job in batch}

        def early(job_id: str, graded: Graded) -> None:
            # Not once a stop began: the run's children are being killed, and what it writes
            # about the job in flight (a subject that died) is the stop's, not the submission's.
            if self.stopping.is_set() or job_id not in by_id:
                return
            if graded.result.status is not Status.ENVIRONMENT_ERROR:
                self._finish(by_id[job_id], graded, started)

        try:
            graded = self.grade(list(jobs.values()), early)
        except MachineBusy as e:
            self._retry = True
            self.log(f"waiting: {e}")
            return self._interrupted(self._not_done(batch), quiet=True)
        except Exception as e:
            if self.stopping.is_set():
                return self._interrupted(self._not_done(batch))
            why = f"{type(e).__name__}: {e}"
            self.log(f"grading {', '.join(jobs)} failed: {why}")
            for job in self._not_done(batch):
                if job.id in jobs:
                    self._failed(job, why)
            return
        if self.stopping.is_set():   # the run was cut short: its other results are not the jobs'
            return self._interrupted(self._not_done(batch))
        for job in self._not_done(batch):
            if job.id not in jobs:
                continue
            if job.id not in graded:
                self._failed(job, "the grading run wrote no result for it")
                continue
            self._finish(job, graded[job.id], started)
        shutil.rmtree(build, ignore_errors=True)   # the results and the sources stay

    def _finish(self, job: Job, graded: Graded, started: float) -> None:
        """The job done with `graded`, once (an early result, or the run's answer)."""
        with self._done_lock:
            if job.id in self._done:
                return
            self._done.add(job.id)
        self.store.finish(job.id, stored_json(graded))
        self.log(f"{job.kind} {job.id} of {job.folder}: {graded.result.status.value} "
                 f"({time.monotonic() - started:.0f} s)")

    def _not_done(self, batch: list[Job]) -> list[Job]:
        with self._done_lock:
            return [job for job in batch if job.id not in self._done]

    def _failed(self, job: Job, why: str) -> None:
        if job.attempts >= self.max_attempts:
            self._give_up(job, why)
        else:
            self.store.requeue(job.id)
            self._retry = True
            self.log(f"{job.kind} {job.id} of {job.folder}: attempt {job.attempts} of "
                     f"{self.max_attempts} failed ({why}); queued again")

    def _give_up(self, job: Job, why: str) -> None:
        self.store.finish(job.id, stored_json(Graded(environment_error(job, why), [])))
        self.log(f"{job.kind} {job.id} of {job.folder}: environment_error after "
                 f"{self.max_attempts} attempts ({why})")

    def _interrupted(self, batch: list[Job], *, quiet: bool = False) -> None:
        for job in batch:
            self.store.requeue(job.id, count_attempt=False)
        if not quiet:
            self.log(f"stopped while grading {', '.join(j.id for j in batch)}: queued again")

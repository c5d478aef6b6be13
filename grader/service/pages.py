"""The service's pages (issue 33): the live students' leaderboard, the upload page, and a
student's own submissions, all from the store's results.

What it guarantees:
- **One renderer.** The live board is the students' page `make grade` writes
  (report.pages.render_leaderboard over report.rows.build_rows(public=True)), given the stored
  SubmissionResults: pseudonyms, hidden cases as a count, no hidden case's id or shape, no
  absolute path. Pseudonyms are always on here, whatever grading.toml [display] says: the live
  page is public while the course runs.
- **What counts.** One row per live student (a token not revoked: Store.live_folders), the
  submission the policy counts (grading.toml [service] counts): `best`, the fastest ranked one
  (if none is ranked yet, the latest finished one, so the student sees where they stand); `last`,
  the latest finished one. Only kind `submission` counts: a check is never on the board; one
  the machine failed to grade (environment_error, not_run) counts only while nothing else has. A
  student whose token was revoked and not reissued is off the board until it is (their results
  stay in the store, and `make grade` over the store still grades them).
- **Scores are not shown live.** The store holds no baselines, so a live score could not carry
  its performance points; the board ranks by time, and grades come from `make grade`.
- **A student's own view** (student_jobs: GET /api/submissions) holds their public cases in
  full and their hidden cases as a count, the verdict scrubbed as the students' page scrubs it.

Stored results are the worker's (worker.stored_json: SubmissionResult.to_dict JSON with the run
file's cases under `run_cases`, so the redactor knows every hidden case's shape and seed); one
that cannot be read is left off the board and shown to its student as unreadable, never guessed
at.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import json
import threading
import time
from collections.abc import Callable

from grader.common import config
from grader.common.status import Status
from grader.course.policy import Policy
from grader.course.results import SubmissionResult
from grader.course.service_drop import COUNTS, fastest
from grader.report.feedback import status_label
from grader.report.pages import environment, render_leaderboard
from grader.report.privacy import Redactor
from grader.report.rows import build_rows
from grader.service.store import Job, Store
from grader.service.worker import RUN_CASES

LIVE_REFRESH_S = 30     # the page's own reload (templates/leaderboard.html.j2)
LIVE_TTL_S = 5.0        # how long one rendering of the board is served to everyone


@dataclasses.dataclass(frozen=True)
class Counted:
    """The submission that stands for one student on the board: its job and its result (its id
    and label the student's folder, as a drop's result would have them), and the cases of the run
    that graded it."""
    folder: str
    job_id: str
    received_at: str
    result: SubmissionResult
    run_cases: tuple[dict, ...] = ()


@dataclasses.dataclass(frozen=True)
class Stored:
    """A job's stored result and the run file's cases it was graded on (id, hidden, line)."""
    result: SubmissionResult
    run_cases: tuple[dict, ...]


def read_stored(job: Job) -> Stored | None:
    """The job's stored result, or None when it has none or it cannot be read."""
    if job.state != "done" or not job.result:
        return None
    try:
        data = json.loads(job.result)
        cases = tuple(c for c in data.pop(RUN_CASES, None) or ()
                      if isinstance(c, dict) and "id" in c)
        result = SubmissionResult.from_dict(data)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    own = tuple(dict(id=c.case, hidden=c.hidden) for c in result.cases)
    return Stored(result, cases or own)


def counted_job(jobs: list[Job], counts: str) -> tuple[Job, Stored] | None:
    """Which of one student's jobs (oldest first, as Store.jobs_of gives them) counts, by the
    policy's `counts`; None when no submission of theirs has finished."""
    if counts not in COUNTS:
        raise ValueError(f"grading.toml [service] counts = {counts!r}: one of {', '.join(COUNTS)}")
    finished = [(j, r) for j in jobs if j.kind == "submission"
                for r in [read_stored(j)] if r is not None]
    # one the machine failed to grade (environment_error, not_run) never displaces a graded one
    finished = [(j, r) for j, r in finished if r.result.status.scored] or finished
    if not finished:
        return None
    if counts == "best":
        best = fastest(finished, lambda jr: jr[1].result)
        if best is not None:
            return best
    return finished[-1]


def counted_results(store: Store, policy: Policy) -> list[Counted]:
    """Each live student's counted submission, sorted by folder."""
    out = []
    for folder in sorted(store.live_folders()):
        chosen = counted_job(store.jobs_of(folder), policy.service_counts)
        if chosen is not None:
            job, stored = chosen
            result = dataclasses.replace(stored.result, id=folder, label=folder, role="student")
            out.append(Counted(folder, job.id, job.received_at, result, stored.run_cases))
    return out


def live_run(counted: list[Counted]) -> dict:
    """The run record the page is rendered against, from the counted results: every case their
    runs had (hidden ones marked, with their lines, so the redactor knows their shapes and
    seeds), the GPU they ran on, the timed case when it is a public one. No device is known
    before anything finished."""
    results = [c.result for c in counted]
    cases: dict[str, dict] = {}
    for entry in [c for one in counted for c in one.run_cases] + \
            [dict(id=c.case, hidden=c.hidden) for r in results for c in r.cases]:
        known = cases.setdefault(entry["id"], dict(id=entry["id"], hidden=False))
        known["hidden"] = known["hidden"] or bool(entry.get("hidden"))
        if entry.get("line") and "line" not in known:
            known["line"] = str(entry["line"])
    gpus = [r.gpu for r in results if r.gpu is not None]
    cuda = bool(gpus) or any(r.timing is not None for r in results)   # nothing is timed on a CPU
    timed = [r.timed_case for r in results
             if r.timed_case and not cases.get(r.timed_case, dict(hidden=True))["hidden"]]
    device = dict(cuda=cuda, name=gpus[0].name if gpus else ("the course's GPU" if cuda else
                                                               "a machine with no CUDA device"))
    return dict(device=device if results else {}, sandboxed=None, calibration=False,
                cases=list(cases.values()),
                timed_case=collections.Counter(timed).most_common(1)[0][0] if timed else None,
                rtol=config.RTOL, atol=config.ATOL)


def live_lines(counted: list[Counted], run: dict, *, students: int, counts: str,
               now: datetime.datetime) -> tuple[str, ...]:
    """The lines at the top of the live page: when, what counts, how many, on what."""
    which = ("each student's fastest passing submission, or their latest one until one passes"
             if counts == "best" else "each student's latest graded submission")
    utc = now.astimezone(datetime.timezone.utc)
    lines = [f"Live: updated {utc.strftime('%Y-%m-%d %H:%M:%S')} UTC; this page reloads every "
             f"{LIVE_REFRESH_S} s.",
             f"On the board: {which} (grading.toml [service] counts = {counts}). Checks are "
             f"never ranked. Names are pseudonyms.",
             f"{len(counted)} of {students} student{'s' if students != 1 else ''} "
             f"{'have' if len(counted) != 1 else 'has'} a graded submission."]
    if not counted:
        lines.append("No submission has been graded yet: the board fills in as the queue's "
                     "submissions finish.")
    else:
        lines.append(f"An element passes within rtol={run['rtol']}, atol={run['atol']}. No scores "
                     f"here: the live board ranks by time; your grade comes from the course's "
                     f"grading run.")
    return tuple(lines)


def render_live_board(store: Store, policy: Policy, *,
                      now: datetime.datetime | None = None) -> str:
    """The live students' page, as the students' page of `make grade` renders it."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    public_policy = dataclasses.replace(policy, pseudonyms=True)
    counted = counted_results(store, public_policy)
    results = [c.result for c in counted]
    run = live_run(counted)
    rows = [dataclasses.replace(row, score=None)   # no baselines here: see the module's doc
            for row in build_rows(results, run=run, policy=public_policy, public=True)]
    lines = live_lines(counted, run, students=len(store.live_folders()),
                       counts=policy.service_counts, now=now)
    return render_leaderboard(rows, run, history=[], public=True, live=lines)


class LiveBoard:
    """The rendered board, shared by every request for `ttl_s` seconds: a class reloading the
    page every 30 s costs one rendering per `ttl_s`, not one per student."""

    def __init__(self, store: Store, policy: Policy, *, ttl_s: float = LIVE_TTL_S,
                 clock: Callable[[], datetime.datetime] | None = None):
        self.store, self.policy, self.ttl_s, self.clock = store, policy, ttl_s, clock
        self._lock = threading.Lock()
        self._page, self._at = "", -1e18

    def html(self) -> str:
        with self._lock:
            if time.monotonic() - self._at >= self.ttl_s or not self._page:
                now = self.clock() if self.clock else None
                self._page = render_live_board(self.store, self.policy, now=now)
                self._at = time.monotonic()
            return self._page


def student_result_view(stored: Stored) -> dict:
    """A student's own result as they may see it: the status, the verdict and hint scrubbed, the
    public cases in full, the hidden cases as a count (no id, shape or message of one)."""
    result = stored.result
    redactor = Redactor.for_run(dict(cases=list(stored.run_cases)))
    shown = redactor.student_result(result, hidden_detail=False)
    hidden = [c for c in result.cases if redactor.is_hidden(c)]
    ran = [c for c in shown.cases if c.status is not Status.NOT_RUN]
    return dict(status=result.status.value, label=status_label(result), ranked=result.ranked,
                verdict=shown.message, hint=shown.hint,
                public=dict(passed=sum(c.status is Status.PASS for c in ran),
                            total=len(shown.cases)),
                hidden=dict(passed=sum(c.status is Status.PASS for c in hidden), total=len(hidden)),
                cases=[dict(case=c.case, status=c.status.value, message=c.message)
                       for c in shown.cases],
                median_ms=shown.timing.median_ms if shown.timing else None,
                tflops=shown.timing.tflops if shown.timing else None,
                timed_case=shown.timed_case)


def student_jobs(store: Store, folder: str, policy: Policy) -> list[dict]:
    """GET /api/submissions: the student's submissions, newest first: id, kind, state, when,
    place in the queue, whether it is the one on the board, and the result as they may see it."""
    jobs = store.jobs_of(folder)
    order = {job_id: i + 1 for i, job_id in enumerate(store.queue_order())}
    chosen = counted_job(jobs, policy.service_counts)
    counted = chosen[0].id if chosen else None
    out = []
    for job in reversed(jobs):
        stored = read_stored(job)
        view = student_result_view(stored) if stored is not None else None
        if job.state == "done" and stored is None:
            view = dict(status="unreadable", label="UNREADABLE", ranked=False,
                        verdict="the grader's result for this submission could not be read: "
                                "tell your instructor its id", hint="", cases=[],
                        public=dict(passed=0, total=0), hidden=dict(passed=0, total=0),
                        median_ms=None, tflops=None, timed_case=None)
        out.append(dict(id=job.id, kind=job.kind, state=job.state, received_at=job.received_at,
                        position=order.get(job.id), attempts=job.attempts,
                        counts=job.id == counted, result=view))
    return out


def render_home(policy: Policy) -> str:
    """The upload page: the form, the course's limits, and (by its script, with the token the
    student typed, kept in sessionStorage only) their own submissions."""
    deadline = policy.service_deadline.isoformat() if policy.service_deadline else None
    return environment().get_template("service_home.html.j2").render(
        checks_per_hour=policy.service_checks_per_hour,
        submissions_per_day=policy.service_submissions_per_day,
        upload_mb=policy.service_upload_mb, counts=policy.service_counts, deadline=deadline)

"""The service's pages (issue 33, grader/service/pages.py): the live students' leaderboard and a
student's own submissions, over HTTP from the real server (uvicorn on loopback), with results put
in the store as the worker puts them (Store.take, Store.finish with a SubmissionResult's JSON).

The board is the students' page of `make grade`: pseudonyms (even where grading.toml turns them
off), hidden cases as a count, no hidden case's id or shape anywhere, the policy's best or last
submission of each live student, checks never ranked. A revoked student is off the board until
their token is reissued."""

from __future__ import annotations

import dataclasses
import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("python_multipart")

from grader.course.policy import Policy  # noqa: E402
from grader.course.results import GpuRef, SubmissionResult  # noqa: E402
from grader.course.verdicts import CaseResult  # noqa: E402
from grader.common.status import Status  # noqa: E402
from grader.service.pages import counted_job  # noqa: E402
from grader.service.store import Job, Store  # noqa: E402
from grader.service.worker import Graded, stored_json  # noqa: E402
from .service_helpers import REPO, free_port, start_server  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "gpu_run"
SALT = "course-2026"
EVIL = "<img src=x onerror=alert(1)>"
# What no student may read: the GPU run's hidden cases' ids, and their shapes in the forms the
# results print them (a dimension no public case has; an element count).
HIDDEN_SECRETS = ("b1_h2_s77_d64", "b3_h5_s113_d128", "b1_h16_s1000_d64", "b2_h3_s2049_d128",
                  "b1_h8_s4097_d64", "4097", "2049", "9856", "2097664", "1573632")

SERVER = """
import sys
sys.path.insert(0, {repo!r})
import uvicorn
from grader.course.policy import Policy
from grader.service.app import create_app
from grader.service.store import Store
policy = Policy(service_counts={counts!r}, pseudonyms={pseudonyms}, pseudonym_salt={salt!r},
                service_checks_per_hour=50, service_submissions_per_day=50)
uvicorn.run(create_app(Store({store!r}), policy, board_ttl_s=0), host="127.0.0.1", port={port},
            log_level="warning")
"""


class PagesService:
    """The real server over a store of its own; the test writes tokens and results into the
    store as the token command and the worker do."""

    def __init__(self, tmp_path: Path, *, counts: str = "best", pseudonyms: bool = True,
                 students: tuple[str, ...] = ("alice", "bob", "carol")):
        self.store_dir = tmp_path / "store"
        self.store = Store(self.store_dir)
        self.tokens = {}
        for folder in students:
            self.tokens[folder] = f"token-{folder}-{len(self.tokens)}"
            self.store.add_token(self.tokens[folder], folder)
        self.instructor = "token-instructor"
        self.store.add_token(self.instructor, "", role="instructor")
        self.policy = Policy(service_counts=counts, pseudonyms=True, pseudonym_salt=SALT)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = start_server(SERVER.format(repo=str(REPO), store=str(self.store_dir),
                                               counts=counts, pseudonyms=pseudonyms, salt=SALT,
                                               port=self.port), self.port)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)
        self.store.close()

    def get(self, path: str, token: str | None = None) -> tuple[int, str, dict]:
        req = urllib.request.Request(self.url + path)
        if token is not None:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.read().decode(), dict(r.headers)
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(), dict(e.headers)

    def mine(self, token: str | None) -> tuple[int, dict]:
        status, text, _ = self.get("/api/submissions", token)
        return status, json.loads(text)

    def graded(self, folder: str, kind: str, result: SubmissionResult | str | None) -> str:
        """An accepted upload of `folder`'s, taken and finished as the worker does, its result
        stored by the worker's own serialiser with the GPU run's cases (a str: stored as is;
        None: left queued). Its id."""
        job = self.store.accept(folder, kind, b"PK\x05\x06" + bytes(18))
        if result is not None:
            taken = self.store.take()
            assert taken is not None and taken.id == job.id, "the test's queue: only this job"
            run_cases = json.loads((FIXTURES / "_run.json").read_text())["cases"]
            if kind == "check":
                run_cases = [c for c in run_cases if not c["hidden"]]
            self.store.finish(job.id, result if isinstance(result, str) else
                              stored_json(Graded(result, run_cases)))
        return job.id


def fixture_result(name: str) -> SubmissionResult:
    return SubmissionResult.from_dict(json.loads((FIXTURES / f"{name}.json").read_text()))


def passing(median_ms: float, folder: str) -> SubmissionResult:
    """A real passing result of the GPU run (3 public and 6 hidden cases), at another time."""
    r = fixture_result("tiled_cuda")
    return dataclasses.replace(r, id=folder, label=folder, gpu=GpuRef(0, "NVIDIA H100 80GB HBM3"),
                               timing=dataclasses.replace(r.timing, median_ms=median_ms),
                               message=f"all 9 cases run pass; median {median_ms:.3f} ms")


def mismatching(folder: str) -> SubmissionResult:
    """The GPU run's missing-rescale kernel: wrong on a hidden case first, its verdict naming it."""
    r = fixture_result("wrong_no_rescale")
    assert "b1_h2_s77_d64" in r.message and any(c.hidden for c in r.cases)
    return dataclasses.replace(r, id=folder, label=folder, gpu=GpuRef(0, "NVIDIA H100 80GB HBM3"))


def checked(median_ms: float, folder: str) -> SubmissionResult:
    """A check: the public cases only, timed, never ranked."""
    r = passing(median_ms, folder)
    return dataclasses.replace(r, cases=tuple(c for c in r.cases if not c.hidden))


def board_rows(html: str) -> list[str]:
    return re.findall(r'<tbody class="student">(.*?)</tbody>', html, re.S)


def row_of(html: str, name: str) -> str:
    rows = [r for r in board_rows(html) if f'title="{name}"' in r]
    assert len(rows) == 1, (name, len(rows))
    return rows[0]


def assert_no_hidden_secret(text: str) -> None:
    for secret in HIDDEN_SECRETS:
        assert secret not in text, secret


@pytest.fixture
def class_of_three(tmp_path, request):
    """alice: two passing submissions (700 ms, then 650 ms), then a mismatching one, a faster
    check and one still queued; bob: a mismatch; carol: one queued, nothing graded."""
    service = PagesService(tmp_path, counts=getattr(request, "param", "best"))
    ids = dict(slow=service.graded("alice", "submission", passing(700.0, "alice")),
               fast=service.graded("alice", "submission", passing(650.0, "alice")),
               wrong=service.graded("alice", "submission", mismatching("alice")),
               check=service.graded("alice", "check", checked(100.0, "alice")),
               bob=service.graded("bob", "submission", mismatching("bob")),
               carol=service.graded("carol", "submission", None),
               queued=service.graded("alice", "check", None))
    yield service, ids
    service.stop()


def test_an_empty_board_says_so_and_the_pages_need_no_token(tmp_path):
    service = PagesService(tmp_path)
    try:
        status, html, headers = service.get("/leaderboard")
        assert status == 200 and headers["content-type"].startswith("text/html")
        assert "No submission has been graded yet" in html and "0 of 3 students" in html
        assert board_rows(html) == [] and '<meta http-equiv="refresh" content="30">' in html
        status, home, _ = service.get("/")
        assert status == 200
        assert '<input type="radio" name="kind" value="check" checked>' in home
        assert '<input type="radio" name="kind" value="submission">' in home
        assert 'accept=".zip,.tar.gz' in home and 'name="file"' in home
        # the token field has no name: a form sent without the script carries no token anywhere
        token_input = re.search(r'<input id="token"[^>]*>', home).group(0)
        assert "name=" not in token_input and 'type="password"' in token_input
        assert 'method="post"' in home
    finally:
        service.stop()


def test_best_counts_the_fastest_pass_under_a_pseudonym_and_no_hidden_shape(class_of_three):
    service, ids = class_of_three
    status, html, _ = service.get("/leaderboard")
    assert status == 200
    alice, bob = service.policy.pseudonym("alice"), service.policy.pseudonym("bob")
    assert len(board_rows(html)) == 2 and "2 of 3 students have a graded submission" in html
    mine = row_of(html, alice)
    assert '<td class="rank num" data-sort="1">' in mine and "650.000" in mine   # its fastest pass
    assert "700.000" not in html and "100.000" not in html      # not the slower one, nor the check
    assert "6/6 hidden" in mine                                 # hidden cases as a count
    assert "mismatch" in row_of(html, bob) and "1/6 hidden" in row_of(html, bob)
    for real in ("alice", "bob", "carol"):
        assert not re.search(rf"\b{real}\b", html), real
    assert_no_hidden_secret(html)
    assert "not scored" in mine      # no baselines in the store: no live score


@pytest.mark.parametrize("class_of_three", ["last"], indirect=True)
def test_last_counts_the_latest_graded_submission(class_of_three):
    service, ids = class_of_three
    html = service.get("/leaderboard")[1]
    mine = row_of(html, service.policy.pseudonym("alice"))
    assert "mismatch" in mine and "650.000" not in html
    assert '<td class="rank num" data-sort="999999">' in mine   # not ranked
    assert "counts = last" in html
    assert_no_hidden_secret(html)


def test_a_student_lists_their_own_submissions_newest_first_as_they_may_see_them(class_of_three):
    service, ids = class_of_three
    status, body = service.mine(service.tokens["alice"])
    assert status == 200
    subs = body["submissions"]
    assert [s["id"] for s in subs] == [ids["queued"], ids["check"], ids["wrong"], ids["fast"],
                                       ids["slow"]]
    assert [s["kind"] for s in subs] == ["check", "check", "submission", "submission", "submission"]
    assert subs[0]["state"] == "queued" and subs[0]["position"] == 2 and subs[0]["result"] is None
    assert [s["counts"] for s in subs] == [False, False, False, True, False]
    fast = subs[3]["result"]
    assert fast["status"] == "pass" and fast["median_ms"] == 650.0
    assert fast["public"] == dict(passed=3, total=3) and fast["hidden"] == dict(passed=6, total=6)
    assert [c["case"] for c in fast["cases"]] == ["b1_h64_s1024_d128", "b2_h64_s4096_d128",
                                                   "b4_h64_s8192_d128"]
    wrong = subs[2]["result"]
    assert wrong["status"] == "mismatch" and "a hidden case" in wrong["verdict"]
    assert wrong["hidden"]["total"] == 6 and wrong["hidden"]["passed"] == 1
    views = json.dumps([s["result"] for s in subs])   # the ids are random hex: checked above
    assert_no_hidden_secret(views)

    status, body = service.mine(service.tokens["bob"])
    assert status == 200 and [s["id"] for s in body["submissions"]] == [ids["bob"]]
    assert_no_hidden_secret(json.dumps(body["submissions"][0]["result"]))


def test_the_list_refuses_with_a_reason(class_of_three):
    service, _ = class_of_three
    for token, status, said in [(None, 401, "no token"), ("guess", 401, "unknown token"),
                                (service.instructor, 403, "instructor's token has no submissions")]:
        got, body = service.mine(token)
        assert got == status and said in body["detail"], (token, body)
    service.store.revoke("bob")
    got, body = service.mine(service.tokens["bob"])
    assert got == 401 and "revoked" in body["detail"]


def test_a_revoked_student_leaves_the_board_until_reissued(class_of_three):
    service, _ = class_of_three
    bob = service.policy.pseudonym("bob")
    assert bob in service.get("/leaderboard")[1]
    service.store.revoke("bob")
    html = service.get("/leaderboard")[1]
    assert bob not in html and "1 of 2 students has a graded submission" in html
    service.store.add_token("token-bob-reissued", "bob")
    assert bob in service.get("/leaderboard")[1]


def test_hostile_names_are_escaped_and_real_names_never_shown(tmp_path):
    """A folder and a verdict that are HTML; grading.toml's pseudonyms = false does not put real
    names on the live page."""
    service = PagesService(tmp_path, pseudonyms=False, students=(EVIL, "dave"))
    try:
        evil = dataclasses.replace(mismatching(EVIL), status=Status.BUILD_ERROR, cases=(
            CaseResult("b1_h64_s1024_d128", Status.NOT_RUN),),
            message=f"build failed in {EVIL}/submission.cu: <b>bold</b>", hint="")
        service.graded(EVIL, "submission", evil)
        service.graded("dave", "submission", passing(800.0, "dave"))
        html = service.get("/leaderboard")[1]
        assert EVIL not in html and "<img" not in html
        assert "&lt;b&gt;bold&lt;/b&gt;" in html   # the verdict, shown as text
        assert service.policy.pseudonym(EVIL) in html
        assert service.policy.pseudonym("dave") in html and not re.search(r"\bdave\b", html)
        status, body = service.mine(service.tokens[EVIL])
        assert status == 200 and body["submissions"][0]["result"]["status"] == "build_error"
    finally:
        service.stop()


def test_an_unreadable_result_is_left_off_the_board_and_said_so_to_its_student(tmp_path):
    service = PagesService(tmp_path)
    try:
        job = service.graded("alice", "submission", '{"truncated": ')
        service.graded("bob", "submission", passing(700.0, "bob"))
        html = service.get("/leaderboard")[1]
        assert len(board_rows(html)) == 1 and "1 of 3 students has a graded submission" in html
        status, body = service.mine(service.tokens["alice"])
        [sub] = body["submissions"]
        assert status == 200 and sub["id"] == job and sub["state"] == "done"
        assert sub["result"]["status"] == "unreadable"
        assert "tell your instructor" in sub["result"]["verdict"]
    finally:
        service.stop()


def test_which_submission_counts_best_or_last_checks_never_and_a_machine_failure_never_displaces():
    def job(n: int, kind: str, result: SubmissionResult | None) -> Job:
        return Job(f"job{n}", "alice", kind, "done" if result else "queued",
                   f"2026-11-27T10:00:{n:02d}+00:00", Path("/nonexistent"), 1,
                   stored_json(Graded(result, [])) if result else None)

    failed = dataclasses.replace(passing(1.0, "alice"), status=Status.ENVIRONMENT_ERROR,
                                 timing=None, cases=())
    jobs = [job(1, "submission", passing(700.0, "alice")),
            job(2, "submission", passing(650.0, "alice")),
            job(3, "submission", mismatching("alice")), job(4, "check", checked(1.0, "alice")),
            job(5, "submission", failed), job(6, "submission", None)]
    assert counted_job(jobs, "best")[0].id == "job2"
    assert counted_job(jobs, "last")[0].id == "job3"
    assert counted_job(jobs[2:], "best")[0].id == "job3"        # none ranked: the latest graded
    assert counted_job(jobs[3:], "last")[0].id == "job5"        # only a failure: it shows
    assert counted_job(jobs[3:4] + jobs[5:], "best") is None    # a check and a queued one: nothing
    with pytest.raises(ValueError, match="counts = 'first'"):
        counted_job(jobs, "first")

"""The check service over HTTP (issue 33, grader/service/app.py): the real server (uvicorn) on
loopback, driven with urllib. A bad token gets 401 and nothing is read; the rate limit 429; a
traversal, a bomb and an oversized upload each a 4xx with nothing kept; the deadline 403; a
student sees only their own submissions; a second service on the store is refused."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("python_multipart")

from grader.course.roster import load_roster  # noqa: E402
from grader.service.store import Store  # noqa: E402
from grader.service.tokens import issue, read_tokens  # noqa: E402

from .test_service_uploads import zipped  # noqa: E402
from .service_helpers import REPO, free_port, multipart, start_server  # noqa: E402


SERVER = """
import datetime, sys
sys.path.insert(0, {repo!r})
from grader.course.policy import Policy
from grader.service.server import serve
serve({store!r}, Policy(service_checks_per_hour=2, service_submissions_per_day=1,
                        service_upload_mb=1.0, service_deadline={deadline}), port={port})
"""


class Service:
    def __init__(self, tmp_path: Path, deadline: str = "None"):
        self.store_dir = tmp_path / "store"
        roster = tmp_path / "roster.csv"
        roster.write_text("folder\nalice\nbob\n")
        issue(Store(self.store_dir), load_roster(roster))
        self.tokens = read_tokens(Store(self.store_dir))
        self.instructor = (self.store_dir / "instructor.token").read_text().strip()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = start_server(SERVER.format(repo=str(REPO), store=str(self.store_dir),
                                               port=self.port, deadline=deadline), self.port)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)

    def request(self, method: str, path: str, *, token: str | None = None, body: bytes = b"",
                headers: dict | None = None) -> tuple[int, dict]:
        req = urllib.request.Request(self.url + path, data=body or None, method=method,
                                     headers=dict(headers or {}))
        if token is not None:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, {**json.loads(e.read() or b"{}"), "_headers": dict(e.headers)}

    def submit(self, token: str | None, data: bytes, kind: str = "check") -> tuple[int, dict]:
        body, headers = multipart(kind, data)
        return self.request("POST", "/api/submissions", token=token, body=body, headers=headers)

    def kept(self) -> list[str]:
        return sorted(p.name for p in (self.store_dir / "uploads").iterdir())


@pytest.fixture
def service(tmp_path):
    s = Service(tmp_path)
    yield s
    s.stop()


GOOD = zipped({"submission.py": b"def custom_kernel(data):\n    return data[0]\n"})


def test_a_student_submits_and_sees_their_own_submission_only(service):
    status, body = service.submit(service.tokens["alice"], GOOD)
    assert status == 201 and body["kind"] == "check" and body["position"] == 1, body
    assert service.kept() == [body["id"]]
    status, seen = service.request("GET", body["status"], token=service.tokens["alice"])
    assert status == 200 and seen["state"] == "queued" and seen["position"] == 1
    assert seen["result"] is None
    assert service.request("GET", body["status"], token=service.tokens["bob"])[0] == 404
    assert service.request("GET", body["status"], token=service.instructor)[0] == 200
    log = Store(service.store_dir).audit_log()
    assert log[0][1:4] == ("alice", "submit", "accepted") and log[0][5] == "127.0.0.1"


def test_a_bad_token_gets_401_and_nothing_is_kept(service):
    for token, said in [(None, "no token"), ("guess", "unknown token"), ("", "no token")]:
        status, body = service.submit(token, GOOD)
        assert status == 401 and said in body["detail"], (token, body)
    assert service.submit(service.instructor, GOOD)[0] == 403
    assert service.request("GET", "/api/submissions/x", token="guess")[0] == 401
    assert service.kept() == []
    refused = [row for row in Store(service.store_dir).audit_log() if row[3] == "refused"]
    assert len(refused) == 4


def test_the_rate_limits_give_429_per_kind(service):
    alice = service.tokens["alice"]
    assert [service.submit(alice, GOOD)[0] for _ in range(2)] == [201, 201]
    status, body = service.submit(alice, GOOD)
    assert status == 429 and "2 checks in the last hour" in body["detail"]
    assert "this course allows 2" in body["detail"]
    assert 3500 < int(body["_headers"]["retry-after"]) <= 3601   # the first check leaves the hour
    assert service.submit(alice, GOOD, kind="submission")[0] == 201   # another kind, its own limit
    assert service.submit(alice, GOOD, kind="submission")[0] == 429
    assert service.submit(service.tokens["bob"], GOOD)[0] == 201     # another student's own
    assert len(service.kept()) == 4


@pytest.mark.parametrize("upload, status, said", [
    (lambda: zipped({"../evil.py": b"x", "submission.py": b"x"}), 400, "leaves its folder"),
    (lambda: zipped({"submission.py": b"\0" * (100 << 20)}), 400, "unpacks to more than"),
    (lambda: b"PK\x03\x04" + bytes(2 << 20), 413, "at most 1.0 MB"),
    (lambda: b"not an archive", 415, "not a .zip or .tar.gz"),
    (lambda: zipped({"readme.md": b"x"}), 422, "has neither submission.cu nor submission.py"),
])
def test_a_bad_upload_gets_a_4xx_with_its_reason_and_nothing_is_kept(service, upload, status, said):
    got, body = service.submit(service.tokens["bob"], upload())
    assert got == status and said in body["detail"], body
    assert service.kept() == []


def test_a_bad_kind_or_form_gets_400(service):
    assert service.submit(service.tokens["bob"], GOOD, kind="rank-me")[0] == 400
    status, body = service.request("POST", "/api/submissions", token=service.tokens["bob"],
                                   body=b"{}", headers={"Content-Type": "application/json"})
    assert status == 400 and "kind" in body["detail"]
    assert service.kept() == []


def test_nothing_is_accepted_after_the_deadline(tmp_path):
    late = Service(tmp_path, deadline="datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)")
    try:
        status, body = late.submit(late.tokens["alice"], GOOD)
        assert status == 403 and "deadline passed" in body["detail"] and late.kept() == []
    finally:
        late.stop()


def test_a_second_service_on_the_same_store_is_refused(service):
    second = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from grader.course.policy import Policy
        from grader.service.server import serve
        serve({str(service.store_dir)!r}, Policy(), port={free_port()})
        """)], capture_output=True, text=True, timeout=120)
    assert second.returncode != 0 and "another service" in second.stderr
    assert f"pid {service.proc.pid}" in second.stderr

"""`python -m grader serve` (issue 33, grader/cli/serve.py): the real service, uvicorn on loopback
with its grading worker, started as the instructor starts it and driven over HTTP. A job
submitted reaches the pipeline's verdict, and its student sees no hidden case; a second service
on the store is refused naming the first's pid; kill -9 with jobs queued and running, then a
restart, and every accepted job completes; SIGTERM stops it cleanly, the job it was grading
queued again. Python submissions graded on the CPU (--cpu), small cases."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("python_multipart")

from grader.service.store import Store  # noqa: E402
from grader.service.tokens import read_tokens  # noqa: E402

from .test_service_uploads import zipped  # noqa: E402
from .test_service_worker import HIDDEN, HIDDEN_ID, NUMPY_CORRECT, PUBLIC, ZEROS  # noqa: E402
from .service_helpers import REPO, free_port, multipart  # noqa: E402

pytestmark = pytest.mark.slow   # the whole grader, on the CPU, behind a real server

SLOW = 900   # seconds: a loaded 2-core machine grades a job in a minute or two


class Served:
    """`python -m grader serve` over a store of alice's and bob's, its output collected."""

    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        self.store_dir = tmp_path / "store"
        self.roster = tmp_path / "roster.csv"
        self.roster.write_text("folder\nalice\nbob\n")
        (tmp_path / "public.txt").write_text(PUBLIC)
        (tmp_path / "hidden.txt").write_text(HIDDEN)
        made = subprocess.run(self.command("tokens"), capture_output=True, text=True, cwd=REPO,
                              timeout=120)
        assert made.returncode == 0, made.stderr
        self.tokens = read_tokens(Store(self.store_dir))
        self.instructor = (self.store_dir / "instructor.token").read_text().strip()
        self.proc: subprocess.Popen | None = None
        self.lines: list[str] = []

    def command(self, action: str = "", port: int | None = None) -> list[str]:
        argv = [sys.executable, "-m", "grader", "serve", *([action] if action else []),
                "--roster", str(self.roster), "--store", str(self.store_dir)]
        if not action:
            argv += ["--port", str(port), "--cpu", "--cases", str(self.tmp / "public.txt"),
                     "--hidden", str(self.tmp / "hidden.txt")]
        return argv

    def start(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.lines = []
        self.proc = subprocess.Popen(self.command(port=self.port), cwd=REPO, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env={**os.environ, "GRADER_RUN_S": "60"})
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()
        end = time.monotonic() + 300
        while time.monotonic() < end:
            if any(line.startswith("service: http://") for line in self.lines):
                return
            if self.proc.poll() is not None:
                time.sleep(0.5)
                raise AssertionError("serve exited:\n" + "".join(self.lines))
            time.sleep(0.2)
        raise AssertionError("serve did not start within 300 s:\n" + "".join(self.lines))

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            self.lines.append(line)

    def kill(self, sig: int = signal.SIGKILL) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=120)

    def request(self, path: str, token: str) -> tuple[int, dict]:
        req = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def submit(self, student: str, data: bytes, kind: str) -> str:
        body, headers = multipart(kind, data)
        req = urllib.request.Request(self.url + "/api/submissions", data=body, method="POST",
                                     headers={"Authorization": f"Bearer {self.tokens[student]}",
                                              **headers})
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.status == 201
            return json.loads(r.read())["id"]

    def state(self, job_id: str) -> dict:
        status, body = self.request(f"/api/submissions/{job_id}", self.instructor)
        assert status == 200, body
        return body

    def wait(self, job_ids: list[str], until, timeout: float = SLOW) -> dict[str, dict]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            states = {j: self.state(j) for j in job_ids}
            if until(states):
                return states
            if self.proc.poll() is not None:
                raise AssertionError("serve exited:\n" + "".join(self.lines))
            time.sleep(1)
        raise AssertionError(f"not reached in {timeout} s: {states}\n" + "".join(self.lines))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()


@pytest.fixture
def served(tmp_path):
    s = Served(tmp_path)
    yield s
    s.stop()


def all_done(states: dict) -> bool:
    return all(s["state"] == "done" for s in states.values())


def test_a_job_submitted_over_http_reaches_its_result_and_a_second_service_is_refused(served):
    served.start()
    started = next(line for line in served.lines if line.startswith("service: http://"))
    assert served.url in started and "2 students" in started and "make submit SERVER=" in started
    job = served.submit("bob", zipped({"bob/submission.py": NUMPY_CORRECT}), "submission")

    second = subprocess.run(served.command(port=free_port()), cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert second.returncode == 2, second.stdout + second.stderr
    assert "another service" in second.stderr and f"pid {served.proc.pid}" in second.stderr

    served.wait([job], all_done)
    status, mine = served.request(f"/api/submissions/{job}", served.tokens["bob"])
    assert status == 200 and mine["state"] == "done" and mine["position"] is None
    result = mine["result"]
    assert result["status"] == "review" and result["hidden_cases"] == dict(of=1, ran=1, passed=1)
    assert HIDDEN_ID not in json.dumps(mine) and "run_cases" not in result
    assert "Cases:" in result["feedback"]
    full = served.state(job)["result"]   # the instructor's: in full
    assert [c["case"] for c in full["cases"] if c["hidden"]] == [HIDDEN_ID]


def test_kill_9_mid_queue_then_a_restart_completes_every_accepted_job(served):
    served.start()
    jobs = [served.submit("alice", zipped({"submission.py": ZEROS}), "check"),
            served.submit("bob", zipped({"submission.py": NUMPY_CORRECT}), "check"),
            served.submit("alice", zipped({"submission.py": NUMPY_CORRECT}), "submission")]
    running = served.wait(jobs, lambda s: any(x["state"] == "running" for x in s.values()))
    assert served.kill() == -signal.SIGKILL
    held = [j for j, s in running.items() if s["state"] == "running"]
    assert Store(served.store_dir).job(held[0]).state == "running"   # as the kill left it

    served.start()
    assert any("queued again" in line for line in served.lines), served.lines
    done = served.wait(jobs, all_done)
    statuses = [done[j]["result"]["status"] for j in jobs]
    assert statuses == ["mismatch", "review", "review"], statuses
    store = Store(served.store_dir)
    assert store.job(held[0]).attempts == 2 and sorted(store.queue_order()) == []


def test_sigterm_stops_the_worker_cleanly_and_the_job_is_graded_at_the_next_start(served):
    served.start()
    job = served.submit("alice", zipped({"submission.py": ZEROS}), "check")
    served.wait([job], lambda s: s[job]["state"] == "running")
    assert served.kill(signal.SIGTERM) == 0, "".join(served.lines)
    assert "Traceback" not in "".join(served.lines), "".join(served.lines)
    assert any("queued again" in line for line in served.lines), served.lines
    left = Store(served.store_dir).job(job)
    assert left.state == "queued" and left.attempts == 0, left   # not the job's fault
    served.start()
    assert served.wait([job], all_done)[job]["result"]["status"] == "mismatch"


@pytest.mark.parametrize("package", ["starlette", "uvicorn", "python_multipart"])
def test_grading_needs_none_of_the_services_packages(package, tmp_path):
    """A machine without the service's packages (an offline GPU box whose .whl/ lacks them)
    still grades: the CLI imports, and `serve` says what is missing and how to get it."""
    roster = tmp_path / "roster.csv"
    roster.write_text("folder\nalice\n")
    code = (f"import sys; sys.modules[{package!r}] = None\n"
            "from grader.cli.main import main\n"
            f"sys.exit(main(['serve', '--roster', {str(roster)!r}, '--store', "
            f"{str(tmp_path / 'store')!r}]))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0
    assert f"needs the package {package!r}" in proc.stderr
    assert "Traceback" not in proc.stderr

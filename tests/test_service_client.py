"""The student's client of the check service (issue 33, grader/cli/client.py): `python -m grader
submit` and `status`, and the kit's `make submit`, run as a student runs them, against the real
server (grader/service/app.py on uvicorn, loopback) over a real store. No worker runs here: a
test takes the job and finishes it with a result itself (Store.take, Store.finish), as the
worker would.

Covered: a folder packed and sent (what is left out, the kind), the id and the exact next
command printed; a queued submission's place; --wait until the verdict, printed as `make check`
prints it with no hidden case named; a failed verdict's exit code; Ctrl-C while waiting; the
server's refusals (401, 429 with when to try again, 413 with the largest files); a folder over
the drop's limits refused before anything is sent; a server that is not there; a wait that goes
on through a restart of the service; the client imports no torch; and the real `make submit` /
`make status` from an unpacked kit."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("python_multipart")

from grader.common.status import Status  # noqa: E402
from grader.course.results import SubmissionResult  # noqa: E402
from grader.course.verdicts import BuildResult, CaseResult, TimingStats  # noqa: E402
from grader.service.store import Store  # noqa: E402
from grader.service.worker import RUN_CASES  # noqa: E402

from .conftest import ctrl_c_reaches_it  # noqa: E402
from .service_helpers import REPO, free_port, start_server  # noqa: E402

ALICE, BOB = "alice-token-4f1c9e", "bob-token-77d2a0"
HIDDEN_ID = "b2_h5_s211_d64"          # a made-up hidden case: its id and shape must not be printed

SERVER = """
import sys
sys.path.insert(0, {repo!r})
import uvicorn
from grader.course.policy import Policy
from grader.service.app import create_app
from grader.service.store import Store
policy = Policy(service_checks_per_hour=2, service_submissions_per_day=5, service_upload_mb=1.0)
uvicorn.run(create_app(Store({store!r}), policy), host="127.0.0.1", port={port},
            log_level="warning")
"""


class Service:
    """The real server in a process of its own; `store` is this process's view of its store."""

    def __init__(self, tmp_path: Path):
        self.store = Store(tmp_path / "store")
        self.store.add_token(ALICE, "alice")
        self.store.add_token(BOB, "bob")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.start()

    def start(self) -> None:
        """The server on this port, over this store (again, after a kill)."""
        self.proc = start_server(SERVER.format(repo=str(REPO), store=str(self.store.folder),
                                               port=self.port), self.port)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        self.kill()
        self.store.close()

    def uploaded(self, job_id: str) -> set[str]:
        """The names in the upload the store kept for `job_id`."""
        with zipfile.ZipFile(self.store.folder / "uploads" / job_id) as z:
            return set(z.namelist())


@pytest.fixture
def service(tmp_path):
    s = Service(tmp_path)
    yield s
    s.stop()


def client_env(**extra: str) -> dict:
    """A student's shell: none of the client's variables, nor a make's, set unless given."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("GRADER_TOKEN", "GRADER_SERVER", "TOKEN", "MAKELEVEL", "MAKEFLAGS",
                        "MFLAGS", "SERVER", "TOKEN_FILE", "KIND", "SUBMISSION")}
    return {**env, **extra}


def client(*args: str, env: dict | None = None,
           timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grader", *args], cwd=REPO, text=True,
                          capture_output=True, env=env or client_env(), timeout=timeout)


def submission_folder(root: Path, name: str = "mine") -> Path:
    """A student's folder as it looks after some work: the file, a helper beside it, and what
    a build, an editor, git and another track leave there."""
    folder = root / name
    (folder / "__pycache__").mkdir(parents=True)
    (folder / "submission.py").write_text("def custom_kernel(data):\n    return data[0]\n")
    (folder / "helpers.py").write_text("SCALE = 1.0\n")
    (folder / "__pycache__" / "submission.cpython-311.pyc").write_bytes(b"\0" * 64)
    (folder / ".git").mkdir()
    (folder / ".git" / "config").write_text("[core]\n")
    (folder / "kernel.o").write_bytes(b"\x7fELF")
    (folder / "triton").mkdir()
    (folder / "triton" / "submission.py").write_text("def custom_kernel(data):\n    pass\n")
    (folder / "notes").mkdir()
    (folder / "notes" / "plan.md").write_text("tile the keys\n")
    return folder


def the_id(out: str) -> str:
    m = re.search(r"accepted: .*, id ([0-9a-f]{32})$", out, re.M)
    assert m, out
    return m.group(1)


def graded(status: Status = Status.PASS, *, hidden: bool = True) -> str:
    """The JSON the worker stores for a graded submission: a SubmissionResult with a public case
    and (`hidden`: a submission's) a hidden one, its timing, and the run's cases
    (worker.RUN_CASES)."""
    public = CaseResult("b1_h2_s33_d64", Status.PASS if status is Status.PASS else status,
                        "" if status is Status.PASS else "mismatch: 12 of 4224 elements outside "
                        "atol=0.01 + rtol=0.01·|expected|; max abs error 0.31")
    result = SubmissionResult(
        id="alice", label="alice", kind="python", role="student", status=status,
        message="all 2 cases pass" if status is Status.PASS else
        "mismatch on case b1_h2_s33_d64: 12 of 4224 elements outside the tolerance",
        hint="" if status is Status.PASS else "Check the rescale of acc when m_i changes.",
        build=BuildResult(Status.PASS, "python", 1.5),
        cases=(public, *([CaseResult(HIDDEN_ID, Status.PASS, "", hidden=True)] if hidden else [])),
        timed_case=HIDDEN_ID if status is Status.PASS else None,
        timing=TimingStats(n=50, median_ms=1.234, mean_ms=1.25, min_ms=1.2, std_ms=0.02,
                           rse=0.003, tflops=87.6, warmup_calls=5, budget_s=5.0,
                           stopped_by="rse", wall_s=2.0) if status is Status.PASS else None,
        graded_at="2026-11-27T10:00:00+00:00")
    data = result.to_dict()
    data[RUN_CASES] = [dict(id="b1_h2_s33_d64", hidden=False,
                              line="batch_size: 1; num_heads: 2; seq_len: 33; head_dim: 64; "
                                   "seed: 2")]
    if hidden:
        data[RUN_CASES].append(dict(id=HIDDEN_ID, hidden=True, line="batch_size: 2; num_heads: "
                                      "5; seq_len: 211; head_dim: 64; seed: 4242"))
    return json.dumps(data)


def finish(service: Service, job_id: str, result_json: str) -> None:
    """What the worker does with the one queued job: take it (running), then record its result."""
    job = service.store.take()
    assert job is not None and job.id == job_id
    service.store.finish(job_id, result_json)


def no_hidden_case_in(text: str) -> None:
    assert HIDDEN_ID not in text and "211" not in text and "4242" not in text, text


# ---------------------------------------------------------------------------- submit


def test_submit_sends_the_folder_and_says_what_to_run_next(service, tmp_path):
    folder = submission_folder(tmp_path)
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "grader", "submit",
                           "--server", service.url, str(folder)], cwd=REPO, text=True,
                          capture_output=True, env=client_env(GRADER_TOKEN=ALICE), timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = the_id(done.stdout)
    job = service.store.job(job_id)
    assert job.folder == "alice" and job.kind == "submission" and job.state == "queued"
    assert service.uploaded(job_id) == {"submission.py", "helpers.py", "notes/plan.md"}
    assert "place in the queue: 1 (next)" in done.stdout
    for left in ("__pycache__/ (build output)", ".git/ (hidden)", "kernel.o (build output)",
                 "triton/ (another submission folder: send it by itself)"):
        assert left in done.stdout, done.stdout
    # the token came from the environment: the next command needs none, and shows none
    assert f"python -m grader status --server {service.url} --wait {job_id}" in done.stdout
    assert ALICE not in done.stdout + done.stderr
    # a laptop needs only Python: the client's path imports neither torch nor numpy
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert "grader.cli.client" in imported
    assert not {m for m in imported if m.split(".")[0] in ("torch", "numpy", "starlette", "jinja2")}


def test_submit_check_from_a_token_file(service, tmp_path):
    folder = submission_folder(tmp_path)
    token_file = tmp_path / "token.txt"
    token_file.write_text(f"{BOB}\n")
    done = client("submit", "--server", service.url + "/", "--token-file", str(token_file),
                  "--check", str(folder))
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = the_id(done.stdout)
    assert service.store.job(job_id).kind == "check" and service.store.job(job_id).folder == "bob"
    assert "a check (the public cases, not ranked)" in done.stdout
    assert (f"python -m grader status --server {service.url} --token-file {token_file} --wait "
            f"{job_id}") in done.stdout


def test_a_folder_that_is_no_submission_is_a_usage_error(service, tmp_path):
    (tmp_path / "empty").mkdir()
    done = client("submit", "--server", service.url, "--token", ALICE, str(tmp_path / "empty"))
    assert done.returncode == 2 and "neither submission.cu nor submission.py" in done.stderr
    done = client("submit", "--server", service.url, str(submission_folder(tmp_path)))
    assert done.returncode == 2 and "no token" in done.stderr and "GRADER_TOKEN" in done.stderr
    done = client("submit", "--server", "ftp://x", "--token", ALICE, str(tmp_path / "mine"))
    assert done.returncode == 2 and "https://" in done.stderr
    assert service.store.jobs_of("alice") == []


# ---------------------------------------------------------------------------- refusals


def test_a_bad_token_prints_the_servers_reason(service, tmp_path):
    done = client("submit", "--server", service.url, "--token", "not-a-token",
                  str(submission_folder(tmp_path)))
    assert done.returncode == 4, done.stdout + done.stderr
    assert "the server refused (HTTP 401): unknown token" in done.stderr
    done = client("status", "--server", service.url, "--token", "not-a-token", "0" * 32)
    assert done.returncode == 4 and "HTTP 401" in done.stderr
    assert service.store.jobs_of("alice") == []


def test_over_the_rate_limit_says_when_to_try_again(service, tmp_path):
    folder = submission_folder(tmp_path)
    env = client_env(GRADER_TOKEN=ALICE)
    for _ in range(2):   # this course: 2 checks an hour
        assert client("submit", "--server", service.url, "--check", str(folder),
                      env=env).returncode == 0
    done = client("submit", "--server", service.url, "--check", str(folder), env=env)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "HTTP 429" in done.stderr and "2 checks in the last hour" in done.stderr
    retry = int(re.search(r"Try again after \d\d:\d\d \(your clock; Retry-After: (\d+) s\)",
                          done.stderr).group(1))
    assert 3500 < retry <= 3601
    assert len(service.store.jobs_of("alice")) == 2


def test_a_folder_over_the_drops_limits_is_refused_before_sending(service, tmp_path):
    folder = submission_folder(tmp_path)
    with open(folder / "activations.bin", "wb") as f:   # sparse: 65 MiB that take no disk
        f.truncate(65 << 20)
    done = client("submit", "--server", service.url, "--token", ALICE, str(folder))
    assert done.returncode == 4, done.stdout + done.stderr
    assert "is too large to submit" in done.stderr and "Nothing was sent" in done.stderr
    assert "The largest: activations.bin (65.0 MB)" in done.stderr
    assert "sending" not in done.stdout
    assert service.store.jobs_of("alice") == [] and service.store.audit_log() == []


def test_over_the_courses_upload_limit_the_server_refuses_and_names_the_largest(service, tmp_path):
    folder = submission_folder(tmp_path)
    (folder / "weights.bin").write_bytes(os.urandom(3 << 20))   # packs to 3 MB; the course: 1 MB
    done = client("submit", "--server", service.url, "--token", ALICE, str(folder))
    assert done.returncode == 4, done.stdout + done.stderr
    assert "HTTP 413" in done.stderr and "at most 1.0 MB" in done.stderr
    assert "The largest: weights.bin (3.0 MB)" in done.stderr
    assert service.store.jobs_of("alice") == []


def test_a_server_that_is_not_there_is_named(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    done = client("submit", "--server", url, "--token", ALICE, str(submission_folder(tmp_path)))
    assert done.returncode == 5, done.stdout + done.stderr
    assert f"cannot connect to {url}: connection refused" in done.stderr
    assert "Check the address and port" in done.stderr
    done = client("status", "--server", "http://no-such-host.invalid", "--token", ALICE, "x")
    assert done.returncode == 5 and "cannot find the server no-such-host.invalid" in done.stderr


# ---------------------------------------------------------------------------- status


def test_status_shows_the_place_in_the_queue(service, tmp_path):
    folder = submission_folder(tmp_path)
    first = the_id(client("submit", "--server", service.url, "--token", BOB, str(folder)).stdout)
    mine = the_id(client("submit", "--server", service.url, "--token", ALICE, str(folder)).stdout)
    done = client("status", "--server", service.url, "--token", ALICE, mine)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "queued: place 2 in the queue; a submission, received " in done.stdout
    assert f"--token <your token> --wait {mine}" in done.stdout and ALICE not in done.stdout
    # without an id: the student's newest, as the service lists them
    newest = client("status", "--server", service.url, env=client_env(GRADER_TOKEN=ALICE))
    assert newest.returncode == 0 and "place 2" in newest.stdout and mine in newest.stdout
    assert service.store.take().id == first
    assert "queued: place 1 in the queue (next)" in client("status", "--server", service.url,
                                                            "--token", ALICE, mine).stdout
    assert client("status", "--server", service.url, "--token", BOB, first).stdout.startswith(
        "running: being graded on the course GPU now; a submission")
    # another student's id is no one's to see
    other = client("status", "--server", service.url, "--token", ALICE, first)
    assert other.returncode == 4 and "HTTP 404" in other.stderr


def test_status_wait_follows_the_queue_to_the_verdict(service, tmp_path):
    folder = submission_folder(tmp_path)
    job_id = the_id(client("submit", "--server", service.url, "--token", ALICE,
                           str(folder)).stdout)
    waiting = subprocess.Popen([sys.executable, "-m", "grader", "status", "--server", service.url,
                                "--wait"], cwd=REPO, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=client_env(GRADER_TOKEN=ALICE))
    try:
        first = waiting.stdout.readline()   # blocks until the client has asked once
        assert first.startswith("queued: place 1 in the queue (next)"), first
        finish(service, job_id, graded(Status.PASS))
        out, err = waiting.communicate(timeout=180)
    finally:
        waiting.kill()
    shown = first + out
    assert waiting.returncode == 0, shown + err
    assert f"graded: a submission (every case, ranked), id {job_id}" in shown
    assert "alice: PASS" in shown and "PASS           b1_h2_s33_d64" in shown
    assert "median 1.234 ms (87.6 TFLOP/s)" in shown
    assert "Hidden cases: 1 of 1 passed; their details are not shown" in shown
    no_hidden_case_in(shown + err)


def test_waiting_goes_on_through_a_restart_of_the_service(service, tmp_path):
    job_id = the_id(client("submit", "--server", service.url, "--token", ALICE,
                           str(submission_folder(tmp_path))).stdout)
    waiting = subprocess.Popen([sys.executable, "-m", "grader", "status", "--server", service.url,
                                "--wait", job_id], cwd=REPO, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=client_env(GRADER_TOKEN=ALICE))
    try:
        assert waiting.stdout.readline().startswith("queued: place 1")
        service.kill()   # kill -9: the accepted submission is in the store
        noticed = waiting.stderr.readline()
        assert noticed.startswith("the service is not answering (cannot connect to"), noticed
        service.start()
        finish(service, job_id, graded(Status.PASS))
        out, err = waiting.communicate(timeout=180)
    finally:
        waiting.kill()
    assert waiting.returncode == 0, out + err
    assert "alice: PASS" in out and f"id {job_id}" in out


def test_a_graded_failure_exits_1_as_make_check_does(service, tmp_path):
    job_id = the_id(client("submit", "--server", service.url, "--token", ALICE, "--check",
                           str(submission_folder(tmp_path))).stdout)
    finish(service, job_id, graded(Status.MISMATCH, hidden=False))
    done = client("status", "--server", service.url, "--token", ALICE, job_id)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "alice: MISMATCH" in done.stdout and "12 of 4224 elements outside" in done.stdout
    assert "Hint: Check the rescale of acc when m_i changes." in done.stdout
    assert "Hidden cases" not in done.stdout   # a check runs none


def test_ctrl_c_while_waiting_leaves_it_queued_and_says_how_to_resume(service, tmp_path):
    job_id = the_id(client("submit", "--server", service.url, "--token", ALICE,
                           str(submission_folder(tmp_path))).stdout)
    waiting = subprocess.Popen([sys.executable, "-m", "grader", "status", "--server", service.url,
                                "--token", ALICE, "--wait", job_id], cwd=REPO, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=client_env(),
                               preexec_fn=ctrl_c_reaches_it)
    try:
        assert waiting.stdout.readline().startswith("queued: place 1")
        waiting.send_signal(signal.SIGINT)
        out, err = waiting.communicate(timeout=60)
    finally:
        waiting.kill()
    assert waiting.returncode == 130, out + err
    assert "stopped waiting: the submission stays in the queue" in err
    assert f"--token <your token> --wait {job_id}" in err and "Traceback" not in err
    assert service.store.job(job_id).state == "queued"


# ---------------------------------------------------------------------------- the kit


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    """The student kit as `make release` builds it, unpacked (its make uses the base Python:
    the client needs no set-up, and the kit has no .venv)."""
    dist = tmp_path_factory.mktemp("dist")
    env = client_env(PYTHON_BASE=sys.executable)
    made = subprocess.run(["make", "release", f"DIST={dist}"], cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=600)
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    archive = next(dist.glob("*.tar.gz"))
    dest = tmp_path_factory.mktemp("kit")
    with tarfile.open(archive) as tar:
        tar.extractall(dest, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return next(p for p in dest.iterdir() if p.is_dir())


def test_make_submit_from_the_unpacked_kit(service, kit, tmp_path):
    env = client_env(PYTHON_BASE=sys.executable)
    assert not (kit / ".venv").exists()
    said = subprocess.run(["make", "-s", "-C", str(kit / "student"), "submit"], env=env, text=True,
                          capture_output=True, timeout=120)
    assert said.returncode != 0 and "make submit: give the service's address: make submit " \
        "SERVER=https://... TOKEN=..." in said.stderr
    done = subprocess.run(["make", "-C", str(kit / "student"), "submit", f"SERVER={service.url}",
                           f"TOKEN={ALICE}", "KIND=check"], env=env, text=True,
                          capture_output=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = the_id(done.stdout)
    assert service.store.job(job_id).kind == "check"
    assert "submission.cu" in service.uploaded(job_id)
    assert not {n for n in service.uploaded(job_id) if n.split("/")[0] in ("triton", "cute",
                                                                           "tilelang")}
    assert f"make status SERVER={service.url} ID={job_id} WAIT=1 TOKEN=<your token>" in done.stdout
    assert ALICE not in done.stdout   # make echoes the recipe, not the token
    # the next command, from student/, with a token file named from there
    (kit / "student" / "token.txt").write_text(ALICE + "\n")
    status = subprocess.run(["make", "-C", str(kit / "student"), "status",
                             f"SERVER={service.url}", f"ID={job_id}", "TOKEN_FILE=token.txt"],
                            env=env, text=True, capture_output=True, timeout=180)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "queued: place 1 in the queue (next); a check" in status.stdout

"""Grading on Slurm (issue 13, grader/executors/slurm.py), against a real single-node Slurm on loopback
(tests/slurm_cluster.py: munged, slurmctld and slurmd from Debian's slurm-wlm). The tasks run on
the CPU: small Python submissions, the Triton-free kind, on one small case.

What is checked: a course graded by Slurm tasks gets the verdicts it gets locally and the same
keys (a local rerun of the folder skips everything, as does a Slurm rerun); a task killed with
scancel leaves its submissions missing, the head names them, and a rerun grades only them;
Ctrl-C on the head cancels the tasks and still writes the page; a partition that does not exist,
a machine with no sbatch, and a worker of no live run are refused with a clear message.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from grader.common import config
from grader.course.results import read_results
from grader.course.runs import WORKERS_FILE, LockHeld, RunSession

from . import slurm_cluster
from .conftest import ctrl_c_reaches_it
from .test_resume import CASES, SLOW, SYNTAX_ERROR, ZEROS   # the same small course

pytestmark = pytest.mark.slow

CORRECT = """
    import numpy as np
    import torch

    def custom_kernel(data):
        q, k, v = (t.detach().cpu().float().numpy() for t in data)
        s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
        p = np.exp(s - s.max(-1, keepdims=True))
        return torch.from_numpy(p / p.sum(-1, keepdims=True) @ v).half()
"""
# "correct" computes in numpy, which the Python audit's allowlist does not hold: right, graded and
# sent to review (grader/trusted/audit/allowlist.py), on Slurm as in a local run.
EXPECTED = dict(correct="review", zeros="mismatch", syntax="build_error")
GRADE_S = 600   # one grading run on a slow, loaded 2-core machine, queueing included


@pytest.fixture(scope="session")
def cluster():
    missing = slurm_cluster.missing_binaries()
    if missing:
        if os.environ.get("REQUIRE_SLURM") == "1":
            pytest.fail(f"REQUIRE_SLURM=1 but {', '.join(missing)} missing "
                        f"(apt-get install slurm-wlm munge)")
        pytest.skip(f"no Slurm here ({', '.join(missing)} missing: apt-get install slurm-wlm munge)")
    c = slurm_cluster.start()
    yield c
    c.stop()


class Course:
    def __init__(self, root: Path, cluster):
        self.root, self.cluster = root, cluster
        self.subs, self.out = root / "subs", root / "results"
        self.subs.mkdir()
        (root / "cases.txt").write_text(CASES)
        (root / "scratch").mkdir()

    def add(self, name: str, source: str) -> Path:
        (self.subs / name).mkdir(exist_ok=True)
        (self.subs / name / "submission.py").write_text(textwrap.dedent(source))
        return self.subs / name

    def args(self, *extra: str) -> list[str]:
        return [sys.executable, "-m", "grader", "grade", str(self.subs), "--out", str(self.out),
                "--build-dir", str(self.root / "build"), "--cases", str(self.root / "cases.txt"),
                "--no-hidden", "--cpu", "--no-solution", *extra]

    def slurm(self, *extra: str) -> list[str]:
        return self.args("--executor", "slurm", "--partition", self.cluster.partition, *extra)

    @property
    def env(self) -> dict:
        return {**self.cluster.env, "GRADER_RUN_S": "120", "GRADER_SLURM_POLL_S": "1",
                "GRADER_SCRATCH_DIR": str(self.root / "scratch"),
                "GRADER_LOCK_DIR": str(self.root / "locks")}

    def run(self, cmd: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=self.env, cwd=config.REPO_ROOT, capture_output=True,
                              text=True, timeout=GRADE_S)

    def start(self, cmd: list[str]) -> subprocess.Popen:
        return subprocess.Popen(cmd, env=self.env, cwd=config.REPO_ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, preexec_fn=ctrl_c_reaches_it)

    def statuses(self) -> dict[str, str]:
        return {r.id: r.status.value for r in read_results(self.out) if r.role == "student"}

    def job(self, timeout: float = 120) -> str:
        """The array id the running head submitted (its workers file names it)."""
        return _wait_for(lambda: _read_json(self.out / WORKERS_FILE).get("job"), timeout,
                         "the head to submit its job")


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _wait_for(probe, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _mtimes(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in out.glob("*.json") if not p.name.startswith("_")}


def grader_version() -> str:
    from grader.course.runs import grader_version
    return grader_version.__wrapped__()   # not the cached one: the code as it is now


def skip_if_grader_changed(before: str, proc) -> None:
    """In a tree others edit while the test runs, a rerun that regrades because the grader's code
    changed under it tests nothing about keys: skip rather than fail."""
    if "grader changed" in proc.stderr and grader_version() != before:
        pytest.skip("the grader's code changed while the test ran (someone is editing grader/)")


def _explain(proc) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-5000:]}"


def test_slurm_grades_as_local_and_resumes(cluster, tmp_path):
    course = Course(tmp_path, cluster)
    course.add("correct", CORRECT)
    course.add("zeros", ZEROS)
    course.add("syntax", SYNTAX_ERROR)
    first = course.run(course.slurm("--slurm-workers", "2"))
    assert first.returncode == 0, _explain(first) + "\n" + cluster.log_tail()
    assert course.statuses() == EXPECTED
    run = json.loads((course.out / "_run.json").read_text())
    assert run["state"] == "finished" and run["executor"]["kind"] == "slurm"
    assert {t["state"] for t in run["slurm"]} == {"finished"}
    assert run["device"]["name"] == "cpu" and all(e["key"] for e in run["roster"])
    assert (course.out / "leaderboard.html").is_file()
    assert not (course.out / WORKERS_FILE).exists()   # no worker is admitted after the run
    assert cluster.queue() == []
    before = _mtimes(course.out)

    # Same keys as a local run on this machine: a local rerun skips every one of them.
    version = grader_version()
    local = course.run(course.args())
    assert local.returncode == 0, _explain(local)
    skip_if_grader_changed(version, local)
    assert "3 of 3 unchanged" in local.stderr, _explain(local)
    assert course.statuses() == EXPECTED

    # And a Slurm rerun too, with other shards: nothing is graded again, no result is rewritten.
    version = grader_version()
    again = course.run(course.slurm("--slurm-workers", "1"))
    assert again.returncode == 0, _explain(again)
    skip_if_grader_changed(version, again)
    assert "graded 0 of 3" in again.stderr and "skipped 3 unchanged" in again.stderr, _explain(again)
    assert _mtimes(course.out) == before


def test_killed_task_leaves_its_submissions_missing_and_a_rerun_grades_them(cluster, tmp_path):
    course = Course(tmp_path, cluster)
    # Shards are dealt from the ids in order: task 0 gets a_zeros and c_syntax, task 1 b_slow.
    course.add("a_zeros", ZEROS)
    slow = course.add("b_slow", SLOW)
    (slow / "slow_seconds.py").write_text("SECONDS = 600\n")
    course.add("c_syntax", SYNTAX_ERROR)
    head = course.start(course.slurm("--slurm-workers", "2"))
    try:
        job = course.job()
        task_file = lambda: next((course.out / "slurm").glob("run-*/task-1.json"), None)
        _wait_for(lambda: (course.out / "a_zeros.json").exists() and task_file(), GRADE_S,
                  "task 0's results and task 1 to start")
        assert cluster.run("scancel", f"{job}_1").returncode == 0
        out, err = head.communicate(timeout=GRADE_S)
    finally:
        if head.poll() is None:
            head.kill()
    print(err)   # shown when the test fails (pytest -rP: always)
    assert head.returncode == 3, f"exit {head.returncode}\n{err[-5000:]}"
    assert "not graded by slurm task 1" in err and "b_slow" in err, err[-5000:]
    assert "log: " in err   # where to look
    statuses = course.statuses()
    assert statuses == dict(a_zeros="mismatch", b_slow="no_result", c_syntax="build_error")
    assert (course.out / "leaderboard.html").is_file()

    (slow / "slow_seconds.py").write_text("SECONDS = 0\n")
    version = grader_version()
    rerun = course.run(course.slurm("--slurm-workers", "2"))
    assert rerun.returncode == 0, _explain(rerun)
    skip_if_grader_changed(version, rerun)
    assert "graded 1 of 3" in rerun.stderr and "skipped 2 unchanged" in rerun.stderr, _explain(rerun)
    assert course.statuses() == dict(a_zeros="mismatch", b_slow="runtime_error",
                                     c_syntax="build_error")


def test_ctrl_c_on_the_head_cancels_the_tasks_and_reports(cluster, tmp_path):
    course = Course(tmp_path, cluster)
    course.add("a_zeros", ZEROS)
    slow = course.add("b_slow", SLOW)
    (slow / "slow_seconds.py").write_text("SECONDS = 600\n")
    head = course.start(course.slurm("--slurm-workers", "1"))
    try:
        job = course.job()
        _wait_for(lambda: (course.out / "a_zeros.json").exists(), GRADE_S, "a_zeros's result")
        head.send_signal(signal.SIGINT)
        out, err = head.communicate(timeout=GRADE_S)
    finally:
        if head.poll() is None:
            head.kill()
    print(err)
    assert head.returncode == 130, f"exit {head.returncode}\n{err[-5000:]}"
    assert f"cancelled job {job}" in err
    _wait_for(lambda: cluster.queue() == [], 120, "the cancelled tasks to leave the queue")
    assert course.statuses() == dict(a_zeros="mismatch", b_slow="no_result")
    assert (course.out / "leaderboard.html").is_file()
    assert json.loads((course.out / "_run.json").read_text())["state"] == "interrupted"


def test_check_runs_as_a_slurm_job_and_prints_the_same_feedback(cluster, tmp_path):
    course = Course(tmp_path, cluster)
    folder = course.add("syntax", SYNTAX_ERROR)   # a verdict with feedback, and no case to wait for

    def check(out: str, *extra):
        return course.run([sys.executable, "-m", "grader", "check", str(folder), "--cpu",
                           "--out", str(tmp_path / out), "--build-dir", str(tmp_path / "build"),
                           *extra])

    on_slurm = check("check-slurm", "--executor", "slurm", "--partition", cluster.partition)
    local = check("check-local")
    assert on_slurm.returncode == local.returncode == 1, _explain(on_slurm) + _explain(local)
    assert "submitted job" in on_slurm.stderr
    # The same text, but for the seconds each took and the results folder.
    same = lambda text: re.sub(r"\d+(\.\d+)? ?s\b", "N s", text.replace("check-slurm", "check-local"))
    assert same(on_slurm.stdout) == same(local.stdout), on_slurm.stdout + "\n---\n" + local.stdout
    assert "BUILD_ERROR" in on_slurm.stdout and "SyntaxError" in on_slurm.stdout, on_slurm.stdout


def test_a_partition_that_does_not_exist(cluster, tmp_path):
    course = Course(tmp_path, cluster)
    course.add("zeros", ZEROS)
    proc = course.run(course.args("--executor", "slurm", "--partition", "nosuch"))
    assert proc.returncode == 2, _explain(proc)
    assert "sbatch refused" in proc.stderr and "nosuch" in proc.stderr, _explain(proc)
    assert "invalid partition" in proc.stderr.lower() and "sinfo" in proc.stderr, _explain(proc)
    assert "Traceback" not in proc.stderr


def test_no_partition_and_no_sbatch_are_usage_errors(tmp_path):
    course = Course(tmp_path, cluster=type("C", (), dict(env=dict(os.environ), partition="x")))
    course.add("zeros", ZEROS)
    proc = course.run(course.args("--executor", "slurm"))
    assert proc.returncode == 2 and "--partition" in proc.stderr, _explain(proc)
    env = {**course.env, "PATH": str(Path(sys.executable).parent)}   # python, and no Slurm
    proc = subprocess.run(course.slurm(), env=env, cwd=config.REPO_ROOT, capture_output=True,
                          text=True, timeout=GRADE_S)
    assert proc.returncode == 2 and "sbatch" in proc.stderr and "not on PATH" in proc.stderr, \
        _explain(proc)


def test_a_worker_needs_its_run_to_admit_it(tmp_path):
    from grader.isolation.device import DeviceInfo
    device = DeviceInfo(cuda=False, name="cpu", capability=None, arch="90a", l2_bytes=0,
                        memory_bytes=0, sm_count=0, driver="none", torch_version="", cuda_version=None,
                        nvcc=None, python="")
    (tmp_path / WORKERS_FILE).write_text(json.dumps(dict(token="theirs")))
    with pytest.raises(LockHeld, match="admits no worker"):
        RunSession(tmp_path, device=device, worker_of="mine").open()
    (tmp_path / WORKERS_FILE).unlink()
    with pytest.raises(LockHeld, match="admits no worker"):
        RunSession(tmp_path, device=device, worker_of="mine").open()

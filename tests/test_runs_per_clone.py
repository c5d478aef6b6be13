"""Several grading runs in one clone (issue 32): each results folder has a build folder of its
own (grader/course/locks.py run_build_dir), so two runs with results folders of their own grade
side by side; two runs on the same results folder are still refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from grader.common import config
from grader.course.locks import LockHeld, drop_lock, folder_lock, run_build_dir

CASES = "batch_size: 1; num_heads: 1; seq_len: 1; head_dim: 64; seed: 1\n"
# Its import waits (at most a minute) until a module "go" beside it can be imported: the test
# decides when the run it belongs to may end, so the other run is known to have run beside it.
# (A file read would be flagged by the audit, and never run.)
WAITS = """\
import time

for _ in range(600):
    try:
        import go  # noqa: F401
        break
    except ImportError:
        time.sleep(0.1)


def custom_kernel(data):
    return data[0]
"""
SYNTAX_ERROR = "def custom_kernel(data)\n    return data[0]\n"


def test_each_results_folder_has_a_build_folder_of_its_own(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    hw1, hw2 = run_build_dir(Path("results-hw1")), run_build_dir(tmp_path / "results-hw2")
    assert hw1 != hw2 and hw1.parent == hw2.parent == config.DEFAULT_BUILD
    assert hw1.name.startswith("results-hw1-") and hw2.name.startswith("results-hw2-")
    # The same results folder, however it is named, has the same one.
    assert run_build_dir(tmp_path / "results-hw1") == hw1 == run_build_dir(Path("./x/../results-hw1"))
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    assert run_build_dir(tmp_path / "alias") == run_build_dir(tmp_path / "real")
    # Folders of one name in two places, and names no folder of the build's can take.
    assert run_build_dir(tmp_path / "a" / "results") != run_build_dir(tmp_path / "b" / "results")
    odd = run_build_dir(tmp_path / "ré sults; rm -rf")
    assert odd.parent == config.DEFAULT_BUILD and all(c.isalnum() or c in "._-" for c in odd.name)
    assert run_build_dir(tmp_path / "cache").name != "cache"   # never the shared build cache


def test_a_second_run_on_a_results_folder_is_refused_as_the_folder_s_lock_refuses_it(tmp_path):
    out, build = tmp_path / "results", tmp_path / "build"
    held = drop_lock(build, out, own=True)
    held.acquire()
    try:
        with pytest.raises(LockHeld) as refused:
            drop_lock(build, out, own=True).acquire()
    finally:
        held.release()
    folder = folder_lock(out)
    assert str(refused.value).startswith(f"{folder.what} is in use by another grading run (pid ")
    assert folder.instead in str(refused.value)
    # A --build-dir two runs share names the drop, and the way around.
    shared = drop_lock(build, out, own=False)
    shared.acquire()
    try:
        with pytest.raises(LockHeld, match="the unpacked drop in .* with --build-dir"):
            drop_lock(build, tmp_path / "other", own=False).acquire()
    finally:
        shared.release()


def _zip(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return path


def _grade(drop: Path, out: Path, cases: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "grader", "grade", str(drop), "--out", str(out), "--cases", str(cases),
         "--no-hidden", "--cpu", "--no-solution", "--no-baselines"],
        cwd=config.REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "GRADER_RUN_S": "60"})


def _until(what: str, done, proc: subprocess.Popen, limit_s: float = 90) -> None:
    end = time.monotonic() + limit_s
    while not done():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the first run ended before {what} (exit {proc.returncode}):\n{err[-3000:]}")
        assert time.monotonic() < end, f"no {what} in {limit_s} s"
        time.sleep(0.2)


@pytest.mark.slow   # two whole grading runs: about 40 s on the 2-core machine
def test_two_runs_with_results_folders_of_their_own_grade_side_by_side(tmp_path):
    """make grade RESULTS=results-hw2 SUBMISSIONS=drop2.zip while make grade RESULTS=results-hw1
    grades: both finish, the second from its own unpacked drop; a third on results-hw1 is refused."""
    cases = tmp_path / "cases.txt"
    cases.write_text(CASES)
    hw1, hw2 = tmp_path / "results-hw1", tmp_path / "results-hw2"
    drop1 = tmp_path / "drop1"   # a folder: graded where it is, so the test can open its gate
    (drop1 / "ana").mkdir(parents=True)
    (drop1 / "ana" / "submission.py").write_text(WAITS)
    gate = drop1 / "ana" / "go.py"
    drop2 = _zip(tmp_path / "drop2.zip", {"bo/submission.py": SYNTAX_ERROR})
    builds = [run_build_dir(hw1), run_build_dir(hw2)]
    first = _grade(drop1, hw1, cases)
    try:
        _until("results folder lock", (hw1 / ".grader.lock").exists, first)

        second = _grade(drop2, hw2, cases)
        _, err = second.communicate(timeout=150)
        assert second.returncode == 0, err[-3000:]
        assert json.loads((hw2 / "bo.json").read_text())["status"] == "build_error"
        assert first.poll() is None, "the first run ended before the second: they did not overlap"
        assert any((builds[1] / config.DROP_SCRATCH).rglob("submission.py"))   # unpacked there

        same = _grade(drop2, hw1, cases)   # the first run's results folder: refused, untouched
        _, err = same.communicate(timeout=150)
        assert same.returncode == 2 and f"the results folder {hw1} is in use by another grading " \
            f"run" in err, err[-3000:]
        assert "--out" in err and "Traceback" not in err
        assert not (hw1 / "bo.json").exists() and not (builds[0] / config.DROP_SCRATCH).exists()

        gate.write_text("")
        _, err = first.communicate(timeout=150)
        assert first.returncode == 0, err[-3000:]
        assert json.loads((hw1 / "ana.json").read_text())["status"] == "mismatch"
        assert (builds[0] / "students").is_dir()   # the first run built in its own folder
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        for build in builds:
            shutil.rmtree(build, ignore_errors=True)

"""Resume and incremental grading (issue 11): a rerun skips what is unchanged; --force and
--only; a grader killed by SIGKILL or stopped by SIGINT leaves no process or scratch file behind
and a rerun redoes only what was unfinished; one run at a time per results folder; the page holds
exactly the run's roster, with missing and unreadable results shown as such.

Every run here is a whole grader process on the CPU with small Python submissions; the timeouts
are generous for a slow 2-core CI machine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from grader.common import config

from grader.isolation import reaper
from grader.course.locks import LockHeld, RunLock, folder_lock
from grader.report.pages import write_reports
from grader.course.results import read_results

from .conftest import ctrl_c_reaches_it

pytestmark = pytest.mark.slow

CASES = "batch_size: 1; num_heads: 2; seq_len: 77; head_dim: 64; seed: 2\n"
ZEROS = """
    import torch
    def custom_kernel(data):
        return torch.zeros_like(data[0])
"""
SYNTAX_ERROR = "def custom_kernel(data)\n    return data\n"
# Sleeps while it is imported (the build stage of a Python submission) for as many seconds as its
# slow_seconds.py says (slow_for).
SLOW = """
    import time
    from slow_seconds import SECONDS
    time.sleep(SECONDS)
    def custom_kernel(data):
        raise ValueError("not finished")
"""


def slow_for(course, seconds: int) -> None:
    (course.root / "z_slow" / "slow_seconds.py").write_text(f"SECONDS = {seconds}\n")


@pytest.fixture
def course(tmp_path):
    """A submissions folder, a case file, a results folder, and a marker every process of the
    test's grader runs carries in its environment (orphans are found by it)."""
    root = tmp_path / "subs"
    root.mkdir()
    (tmp_path / "cases.txt").write_text(CASES)
    (tmp_path / "scratch").mkdir()
    mark = uuid.uuid4().hex

    def add(name: str, source: str) -> Path:
        (root / name).mkdir(exist_ok=True)
        (root / name / "submission.py").write_text(textwrap.dedent(source))
        return root / name

    class Course:
        pass

    c = Course()
    c.root, c.out, c.tmp, c.add, c.mark = root, tmp_path / "results", tmp_path, add, mark
    c.scratch = tmp_path / "scratch"
    c.args = lambda *extra, subs=root: [
        "grade", str(subs), "--out", str(c.out), "--build-dir", str(tmp_path / "build"),
        "--cases", str(tmp_path / "cases.txt"), "--no-hidden", "--cpu", "--no-solution", *extra]
    c.env = lambda **extra: {**os.environ, "GRADER_RUN_S": "60", "GRADER_TEST_MARK": mark,
                             "GRADER_SCRATCH_DIR": str(c.scratch),
                             "GRADER_LOCK_DIR": str(tmp_path / "locks"), **extra}
    yield c
    for pid in carriers(mark):   # never leave a stray behind, whatever the test found
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def grade(c, *extra, subs=None, timeout=600, **env) -> subprocess.CompletedProcess:
    args = c.args(*extra, subs=subs or c.root)
    return subprocess.run([sys.executable, "-m", "grader", *args], capture_output=True, text=True,
                          cwd=config.REPO_ROOT, env=c.env(**env), timeout=timeout)


def carriers(mark: str) -> list[int]:
    """Live processes whose environment holds the test's marker."""
    return reaper.carriers(mark, variable="GRADER_TEST_MARK")


def running(text: str) -> bool:
    """A process whose command line contains `text` exists."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        return True
            except OSError:
                continue
    return False


def wait_for(predicate, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def stamp(path: Path) -> tuple[int, int]:
    """Changes whenever the file is rewritten (results are replaced, never edited in place)."""
    st = path.stat()
    return st.st_ino, st.st_mtime_ns


def test_rerun_skips_unchanged_regrades_changed_and_honours_force_and_only(course):
    course.add("zeros", ZEROS)
    course.add("broken", SYNTAX_ERROR)
    first = grade(course)
    assert first.returncode == 0, first.stderr[-3000:]
    results = {p: course.out / f"{p}.json" for p in ("zeros", "broken")}
    before = {p: stamp(r) for p, r in results.items()}

    again = grade(course)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "2 of 2 unchanged since they were graded" in again.stderr
    assert "zeros: unchanged since" in again.stderr and "broken: unchanged since" in again.stderr
    assert "graded 0 of 2" in again.stderr and "skipped 2 unchanged" in again.stderr
    assert {p: stamp(r) for p, r in results.items()} == before
    run = json.loads((course.out / "_run.json").read_text())
    assert run["state"] == "finished" and run["progress"]["skipped"] == 2
    assert {r.id: r.status.value for r in read_results(course.out)} == \
        {"zeros": "mismatch", "broken": "build_error"}

    course.add("broken", SYNTAX_ERROR + "# a new version\n")
    changed = grade(course)
    assert changed.returncode == 0, changed.stderr[-3000:]
    assert "regrading broken: source changed" in changed.stderr
    assert "zeros: unchanged since" in changed.stderr
    assert stamp(results["zeros"]) == before["zeros"] and stamp(results["broken"]) != before["broken"]

    before = {p: stamp(r) for p, r in results.items()}
    forced = grade(course, "--force")
    assert forced.returncode == 0 and "unchanged since" not in forced.stderr
    assert all(stamp(r) != before[p] for p, r in results.items())

    before = {p: stamp(r) for p, r in results.items()}
    only = grade(course, "--only", "zeros")
    assert only.returncode == 0, only.stderr[-3000:]
    assert "--only: grading 1 of 2; the other 1 keep their results" in only.stderr
    assert stamp(results["zeros"]) != before["zeros"] and stamp(results["broken"]) == before["broken"]
    assert sorted(r.id for r in read_results(course.out)) == ["broken", "zeros"]   # one run

    unknown = grade(course, "--only", "nobody")
    assert unknown.returncode == 2 and "no submission named 'nobody'" in unknown.stderr


def _start_slow_run(course) -> subprocess.Popen:
    """Two fast submissions (build errors) and one whose build sleeps; one build at a time, so
    the fast ones are finished when the slow one is building."""
    course.add("a_fast", SYNTAX_ERROR)
    course.add("b_fast", SYNTAX_ERROR + "# b\n")
    course.add("z_slow", SLOW)
    slow_for(course, 900)
    proc = subprocess.Popen([sys.executable, "-m", "grader", *course.args("--jobs", "1")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=config.REPO_ROOT, env=course.env(),
                            start_new_session=True, preexec_fn=ctrl_c_reaches_it)
    wait_for(lambda: (course.out / "a_fast.json").exists() and (course.out / "b_fast.json").exists()
             and running("z_slow/submission.py"), 300, "the fast results and the slow build")
    assert [p for p in carriers(course.mark) if p != proc.pid], "no child to orphan: test is void"
    assert list(course.scratch.glob("grader-run-*")), "no scratch folder in use: test is void"
    return proc


def _nothing_left(course) -> None:
    wait_for(lambda: not carriers(course.mark), 60, "every child of the grader to die")
    wait_for(lambda: not list(course.scratch.iterdir()), 60, "the scratch folder to be removed")
    assert not running("z_slow/submission.py")


def _rerun_redoes_only_the_unfinished(course, stamps) -> None:
    slow_for(course, 0)
    rerun = grade(course)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "a_fast: unchanged since" in rerun.stderr and "b_fast: unchanged since" in rerun.stderr
    assert "graded 1 of 3" in rerun.stderr and "skipped 2 unchanged" in rerun.stderr
    assert {p: stamp(course.out / f"{p}.json") for p in stamps} == stamps
    got = {r.id: r.status.value for r in read_results(course.out)}
    assert got == {"a_fast": "build_error", "b_fast": "build_error", "z_slow": "runtime_error"}


def test_sigkill_mid_run_leaves_no_orphan_or_scratch_and_a_rerun_finishes(course):
    proc = _start_slow_run(course)
    stamps = {p: stamp(course.out / f"{p}.json") for p in ("a_fast", "b_fast")}
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    _nothing_left(course)
    run = json.loads((course.out / "_run.json").read_text())
    assert run["state"] == "running" and run["progress"]["graded"] == 2   # how far it got
    half = course.out / ".z_slow.json.k9x2.tmp"   # what a kill in the middle of a write leaves
    half.write_text('{"schema": 1, "id": "z_sl')
    _rerun_redoes_only_the_unfinished(course, stamps)
    assert not half.exists()


def test_sigint_stops_promptly_renders_the_page_and_a_rerun_finishes(course):
    proc = _start_slow_run(course)
    stamps = {p: stamp(course.out / f"{p}.json") for p in ("a_fast", "b_fast")}
    sent = time.monotonic()
    os.kill(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert time.monotonic() - sent < 60, "Ctrl-C did not stop the run promptly"
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr
    assert "interrupted: 2 of 3 graded" in stderr and "1 missing result" in stderr
    _nothing_left(course)
    run = json.loads((course.out / "_run.json").read_text())
    assert run["state"] == "interrupted"
    page = (course.out / "leaderboard.html").read_text()
    assert "z_slow" in page and "result missing" in page and "the run was interrupted" in page
    _rerun_redoes_only_the_unfinished(course, stamps)


def test_a_second_run_is_refused_naming_the_holder_and_a_stale_lock_is_taken_over(course):
    course.add("broken", SYNTAX_ERROR)
    course.out.mkdir()
    lock = folder_lock(course.out)
    lock.acquire()
    try:
        refused = grade(course)
    finally:
        lock.release()
    assert refused.returncode == 2
    assert "is in use by another grading run" in refused.stderr
    assert f"pid {os.getpid()} on " in refused.stderr and "started" in refused.stderr
    assert not (course.out / "broken.json").exists()

    dead = subprocess.Popen(["true"])
    dead.wait()
    (course.out / ".grader.lock").write_text(json.dumps(dict(
        pid=dead.pid, host=os.uname().nodename, started="2026-11-22T01:00:00+00:00",
        command="python -m grader grade course")))
    took = grade(course)
    assert took.returncode == 0, took.stderr[-3000:]
    assert f"took over the lock on the results folder {course.out} from pid {dead.pid}" in took.stderr
    assert "no longer running" in took.stderr
    assert (course.out / ".grader.lock").read_text() == ""   # released cleanly at the end


def test_gpu_lock_is_exclusive_per_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADER_LOCK_DIR", str(tmp_path / "locks"))
    from grader.course.locks import gpu_lock
    first = gpu_lock("GPU-1234", "NVIDIA H200")
    assert first.acquire() == ""
    try:
        with pytest.raises(LockHeld, match=r"the GPU GPU-1234 is in use by another grading run \(pid \d+ on "):
            gpu_lock("GPU-1234").acquire()
        other = gpu_lock("GPU-5678")
        assert other.acquire() == ""   # another GPU of the machine is free
        other.release()
    finally:
        first.release()
    again = RunLock(tmp_path / "locks" / "gpu-GPU-1234.lock", "the GPU")
    assert again.acquire() == ""       # released: no takeover note
    again.release()


def test_page_holds_one_run_and_shows_missing_or_unreadable_results(course):
    for name in ("alice", "bob"):
        course.add(name, SYNTAX_ERROR)
    assert grade(course).returncode == 0
    other = course.tmp / "other"
    (other / "carol").mkdir(parents=True)
    (other / "carol" / "submission.py").write_text(SYNTAX_ERROR)
    second = grade(course, subs=other)
    assert second.returncode == 0, second.stderr[-3000:]
    assert [r.id for r in read_results(course.out)] == ["carol"]
    summary = json.loads((course.out / "_summary.json").read_text())
    assert [row["id"] for row in summary["rows"]] == ["carol"]
    assert sorted(p.name for p in (course.out / "feedback").iterdir()) == ["carol.md"]
    assert (course.out / "alice.json").exists()   # another run's result: kept, not shown

    for name in ("alice", "bob", "dave"):
        course.add(name, SYNTAX_ERROR)
    assert grade(course).returncode == 0
    (course.out / "alice.json").write_text((course.out / "alice.json").read_text()[:100])
    newer = json.loads((course.out / "bob.json").read_text())
    (course.out / "bob.json").write_text(json.dumps({**newer, "schema": 99}))
    (course.out / "carol.json").unlink()   # not in this run: nothing to show
    dave = json.loads((course.out / "dave.json").read_text())
    dave["new_field"] = 1
    dave["build"]["new_build_field"] = "x"
    (course.out / "dave.json").write_text(json.dumps(dave))
    shown = subprocess.run([sys.executable, "-m", "grader", "leaderboard", "--out", str(course.out)],
                           capture_output=True, text=True, cwd=config.REPO_ROOT, timeout=300)
    assert shown.returncode == 0, shown.stderr[-3000:]
    by_id = {r.id: r for r in read_results(course.out)}
    assert sorted(by_id) == ["alice", "bob", "dave"]
    assert by_id["alice"].message.startswith(f"result unreadable: {course.out / 'alice.json'}: truncated")
    assert "newer grader (schema 99" in by_id["bob"].message and by_id["bob"].no_result
    assert by_id["dave"].status.value == "build_error" and not by_id["dave"].no_result
    page = (course.out / "leaderboard.html").read_text()
    assert "result unreadable" in page and "newer grader" in page and "dave" in page
    assert "result unreadable" in shown.stdout

    (course.out / "dave.json").unlink()
    shown = subprocess.run([sys.executable, "-m", "grader", "leaderboard", "--out", str(course.out)],
                           capture_output=True, text=True, cwd=config.REPO_ROOT, timeout=300)
    assert shown.returncode == 0 and "result missing" in shown.stdout

    run_file = course.out / "_run.json"
    run_file.write_text(run_file.read_text()[:200])
    broken = subprocess.run([sys.executable, "-m", "grader", "leaderboard", "--out", str(course.out)],
                            capture_output=True, text=True, cwd=config.REPO_ROOT, timeout=300)
    assert broken.returncode == 2 and "Traceback" not in broken.stderr
    assert f"{run_file}: truncated or not JSON" in broken.stderr


def test_grades_csv_holds_the_roster_of_the_run(tmp_path):
    """The CSV needs a GPU run: the real GPU run's results, with a roster of two of them and a
    student whose result is gone, and a stray result of another run in the folder."""
    fixtures = Path(__file__).parent / "fixtures" / "gpu_run"
    import shutil
    out = tmp_path / "results"
    shutil.copytree(fixtures, out)
    run = json.loads((out / "_run.json").read_text())
    run["roster"] = [dict(id=i, role="student", kind="cuda", label=i, result=f"{i}.json", key=None)
                     for i in ("naive_cuda", "skeleton", "ghost")]
    run["roster"] += [dict(id=b, role="baseline", kind="builtin", label=b,
                           result=f"baselines/{b}.json", key=None)
                      for b in ("torch_reference", "sdpa_flash")]
    (out / "_run.json").write_text(json.dumps(run))
    paths = write_reports(out)
    rows = (out / "grades.csv").read_text(encoding="utf-8-sig").splitlines()
    text = "\n".join(rows)
    assert "naive_cuda" in text and "skeleton" in text and "ghost" in text
    assert "tiled_cuda" not in text and "triton_flash" not in text   # other runs' results
    assert len(rows) == 1 + 3
    assert paths["leaderboard"].read_text().count("result missing") >= 1


def test_a_lock_file_planted_as_a_link_is_refused_and_its_target_untouched(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("secret")
    victim.chmod(0o600)
    (tmp_path / "locks").mkdir()
    (tmp_path / "locks" / "gpu-x.lock").symlink_to(victim)
    with pytest.raises(LockHeld, match="gpu-x.lock"):
        RunLock(tmp_path / "locks" / "gpu-x.lock", "the GPU x").acquire()
    assert victim.read_text() == "secret" and victim.stat().st_mode & 0o777 == 0o600
    hard = tmp_path / "locks" / "hard.lock"
    os.link(victim, hard)
    with pytest.raises(LockHeld, match="not a plain file"):
        RunLock(hard, "the GPU y").acquire()
    assert victim.read_text() == "secret"

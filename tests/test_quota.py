"""grader/isolation/quota.py: what a submission's processes may keep in a folder they write. Each attack
writes past small limits in a real process tree; the honest twin stays under them."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from grader.common import config

from grader.stages import context

from grader.stages import grade as grading
from grader.build.stage import build_submission
from grader.course.verdicts import BuildResult
from grader.problem import Case
from grader.trusted.correctness import WarmChecker
from grader.report.progress import Progress
from grader.isolation.quota import Quota, usage
from grader.isolation.sandbox import Sandbox, default_layout
from grader.common.status import Status
from grader.course.submission import inspect_folder

from .test_build import CPU

MIB = 1 << 20

# Writes `count` files of `size` bytes into FOLDER, each from a new child (a writer that holds no
# file open between files, whose parent writes nothing), then sleeps: it must be killed.
WRITER = """
import os, subprocess, sys, time
folder, count, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if len(sys.argv) > 4:   # one file, then exit
    with open(os.path.join(folder, sys.argv[4]), "wb") as f:
        f.write(os.urandom(size))
    sys.exit(0)
for i in range(count):
    subprocess.run([sys.executable, __file__, folder, "1", str(size), f"f{i}"])
print("wrote all", flush=True)
time.sleep(60)
"""


def _writer(tmp_path: Path, folder: Path, count: int, size: int) -> subprocess.Popen:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    return subprocess.Popen([sys.executable, str(script), str(folder), str(count), str(size)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)


def _wait(proc: subprocess.Popen, timeout_s: float = 60) -> int | None:
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None


def test_usage_counts_allocated_blocks_and_stops_at_the_limits(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "data").write_bytes(b"x" * (2 * MIB))
    with open(tmp_path / "sparse", "wb") as f:   # 1 GiB long, nothing written: nearly nothing held
        f.truncate(1 << 30)
    held, files, hidden = usage(tmp_path, 1 << 40, 10**6)
    assert 2 * MIB <= held < 3 * MIB and files == 3 and not hidden
    for i in range(50):
        (tmp_path / f"n{i}").touch()
    assert usage(tmp_path, 1 << 40, 10)[1] == 11   # counting stopped just past the limit


def test_what_is_nested_past_path_max_is_counted_and_removed(tmp_path):
    """Red team, session 18: a walk by path names skipped folders nested past PATH_MAX (4096),
    and what was in them. By folder descriptors (os.fwalk) they are counted, and removed."""
    deep = os.open(tmp_path, os.O_RDONLY)
    for _ in range(300):   # 300 x 20 characters: 6000 past tmp_path
        os.mkdir("d" * 20, dir_fd=deep)
        inner = os.open("d" * 20, os.O_RDONLY, dir_fd=deep)
        os.close(deep)
        deep = inner
    for i in range(4):
        fd = os.open(f"f{i}", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=deep)
        os.write(fd, b"x" * MIB)
        os.close(fd)
    os.close(deep)
    held, files, hidden = usage(tmp_path, 1 << 40, 10**6)
    assert held >= 4 * MIB and files == 304 and not hidden
    quota = Quota()
    with quota.watch(tmp_path, 2 * MIB, 10**6):
        assert quota.over(tmp_path) is not None
    assert list(tmp_path.iterdir()) == []


def test_a_tree_that_writes_past_the_limit_is_killed_and_its_files_removed(tmp_path):
    """The whole attached tree dies, the writer's parent too though it held no file, the
    folder is emptied and the watch says what it held; a root attached as spared (a harness)
    lives. An honest tree under the limits is left alone."""
    quota = Quota(poll_s=0.05)
    folder, calm = tmp_path / "jit", tmp_path / "calm"
    folder.mkdir()
    calm.mkdir()
    with quota.watch(folder, 4 * MIB, 1000) as watch, quota.watch(calm, 4 * MIB, 1000) as honest:
        harness = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                   start_new_session=True)
        writer = _writer(tmp_path, folder, 100, MIB)   # 100 MiB if nothing stops it
        quiet = _writer(tmp_path, calm, 2, MIB)        # 2 MiB, then it waits
        quota.attach(folder, writer.pid, spare_root=False)
        quota.attach(folder, harness.pid, spare_root=True)
        quota.attach(calm, quiet.pid, spare_root=False)
        try:
            assert _wait(writer) is not None, "the writer was not killed"
            assert quiet.stdout.readline().strip() == "wrote all"
            time.sleep(0.3)
            assert watch.over is not None and watch.over[0] > 4 * MIB
            assert quota.over(folder) is watch and quota.over(calm) is None
            assert harness.poll() is None and quiet.poll() is None   # spared; under the limits
            assert honest.over is None and len(list(calm.iterdir())) == 2
            time.sleep(0.3)   # the poll after the kill has emptied it
            assert folder.is_dir() and usage(folder, 1 << 40, 10**6)[0] < 4 * MIB
            assert len(list(folder.iterdir())) < 100
            assert "more than the grader allows into its cache" in watch.message("its cache")
        finally:
            for proc in (harness, writer, quiet):
                proc.kill()
                proc.wait()
    assert quota.over(folder) is None   # the watch ended with its folder


def test_too_many_files_is_over_too_and_a_pid_given_to_another_process_is_not_killed(tmp_path):
    quota = Quota(poll_s=0.05)
    folder = tmp_path / "many"
    folder.mkdir()
    with quota.watch(folder, 1 << 40, 20) as watch:
        bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            quota.attach(folder, bystander.pid, spare_root=False)
            watch.roots[bystander.pid] = (1, False)   # as if its pid once was another process's
            for i in range(30):
                (folder / f"f{i}").touch()
            deadline = time.monotonic() + 30
            while watch.over is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert watch.over is not None and watch.over[1] > 20
            time.sleep(0.3)
            assert bystander.poll() is None
        finally:
            bystander.kill()
            bystander.wait()


FILLS_AT_IMPORT = """
    import os
    for i in range(200):   # 200 MiB if nothing stops it
        with open(os.path.join({folder!r}, f"junk{{i}}"), "wb") as f:
            f.write(b"x" * (1 << 20))
    def custom_kernel(data):
        return data[2]
"""


def test_an_import_that_fills_its_build_folder_is_a_build_error(make_submission, tmp_path):
    """A Python submission's import check runs its code with its build folder writable (the
    source audit that flags file writes comes before it in a course; this is the mechanism
    beneath it). Past the folder's limits: killed, a build error that says why."""
    limits = config.Limits(folder_gb=8 / 1024, folder_files=1000)   # 8 MiB
    build_dir = tmp_path / "b"
    sub = inspect_folder(make_submission("fills", FILLS_AT_IMPORT.format(folder=str(build_dir))))
    started = time.monotonic()
    got = build_submission(sub, build_dir=build_dir, device=CPU, limits=limits)
    assert got.status is Status.BUILD_ERROR, got
    assert "more than the grader allows into its build folder" in got.message
    assert time.monotonic() - started < limits.import_s   # killed, not timed out
    assert list(build_dir.iterdir()) == []
    # under the limits, it passes; what it wrote does not outlive its import check either
    honest = make_submission("honest", FILLS_AT_IMPORT.replace("range(200)", "range(2)")
                             .format(folder=str(tmp_path / "h")))
    assert build_submission(inspect_folder(honest), build_dir=tmp_path / "h", device=CPU,
                            limits=limits).status is Status.PASS
    assert list((tmp_path / "h").iterdir()) == []


FILLS_ITS_JIT_CACHE = """
    import os, time
    def custom_kernel(data):
        folder = os.environ["TRITON_CACHE_DIR"]
        for i in range(200):   # 200 MiB if nothing stops it
            with open(os.path.join(folder, f"kernel{i}.bin"), "wb") as f:
                f.write(b"x" * (1 << 20))
        time.sleep(100)   # and on: only a kill ends it before the run stage's limit
        return data[2].clone()
"""


@pytest.fixture
def no_checker_left():
    """The warm checker these in-process gradings start is stopped after them (as a run's end
    does), so no later test finds a child of this process it did not start."""
    yield
    for checker in list(WarmChecker._kept.values()):
        checker._stop()


@pytest.mark.parametrize("sandboxed", [False, True])
def test_a_run_that_fills_its_jit_cache_is_a_runtime_error(make_submission, tmp_path, sandboxed,
                                                          no_checker_left):
    """The run stage's subject writes its JIT cache past the limits: it is killed (the harness
    lives and reports), and the verdict names the folder and the limits, not a crash."""
    sandbox = Sandbox.probe(**default_layout(), mode="auto") if sandboxed else None
    if sandboxed and not sandbox.active:
        pytest.skip("bubblewrap cannot run here")
    limits = config.Limits(folder_gb=8 / 1024, folder_files=1000, run_s=120)
    case = Case(1, 2, 16, 64, seed=3)
    ctx = context.GradeContext(cases=(case,), device=CPU, limits=limits, out_dir=tmp_path / "out",
                                build_dir=tmp_path / "build",
                                progress=Progress(1, live=False, stream=io.StringIO()),
                                sandbox=sandbox or Sandbox(None, "off in this test"))
    built = BuildResult(Status.PASS, "import", 0.1)
    for name, source, want in (("fills", FILLS_ITS_JIT_CACHE, Status.RUNTIME_ERROR),
                               ("honest", "def custom_kernel(data):\n    return data[2].clone()\n",
                                Status.MISMATCH)):   # V is not attention: a verdict of its own
        sub = inspect_folder(make_submission(name, textwrap.dedent(source)))
        started = time.monotonic()
        result = grading.grade_submission(sub, built, ctx)
        assert result.status is want, (name, result.message)
        assert time.monotonic() - started < 60   # killed as it went over
        assert ("more than the grader allows into its JIT cache folder" in result.message) \
            == (name == "fills"), result.message

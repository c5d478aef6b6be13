"""Builds at a lower CPU priority than the runs begun early that share their CPUs (issue 32;
grader/isolation/priority.py): the build's processes at Limits.build_nice, and their session's
scheduling group too, sandboxed or not, however many start at once."""

import dataclasses
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from grader.build.stage import build_submission
from grader.common import config
from grader.common.status import Status
from grader.course.submission import inspect_folder
from grader.isolation.device import DeviceInfo
from .devices import CPU
from grader.isolation.procs import child_env, run_limited
from grader.isolation.sandbox import Sandbox, default_layout


# What the import check of this submission prints: its process's nice and its session's group.
TELL = """
import os
try:
    group = open("/proc/self/autogroup").read().strip()
except OSError:
    group = "none"
print(f"PRIORITY nice={os.nice(0)} group={group}", flush=True)

def custom_kernel(data):
    return data[0]
"""


def autogroups() -> bool:
    """Whether this kernel groups processes by session for scheduling."""
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1" \
            and Path("/proc/self/autogroup").exists()
    except OSError:
        return False


def told(text: str) -> tuple[int, int | None]:
    """(nice, the session group's nice or None) from TELL's line."""
    m = re.search(r"PRIORITY nice=(\d+) group=(.*)", text)
    assert m, text[-2000:]
    group = re.search(r"nice (-?\d+)", m.group(2))
    return int(m.group(1)), int(group.group(1)) if group else None


def box_or_skip() -> Sandbox:
    box = Sandbox.probe(**default_layout(), mode="auto")
    if not box.active:
        if os.environ.get("REQUIRE_SANDBOX") == "1":
            pytest.fail("REQUIRE_SANDBOX=1 but bubblewrap cannot run here")
        pytest.skip(f"no sandbox here: {box.reason}")
    return box


GPU = dataclasses.replace(CPU, cuda=True, name="NVIDIA H100", capability=(9, 0))


@pytest.fixture
def reserving(monkeypatch):
    """A machine big enough that the GPU stages keep a CPU of their own (cpus.split_cpus): here,
    any with two CPUs, one of them the GPU stages'."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    monkeypatch.setattr(config, "RESERVE_MIN_CPUS", 2)


def build_says(make_submission, tmp_path, name: str, *, nice: int, sandbox: Sandbox | None,
               device: DeviceInfo = GPU):
    """An import check's own view of its priority (a build on a GPU machine: the import check
    needs no GPU, and gets none); the GPU stages keep one CPU where the machine reserves any."""
    folder = make_submission(name, TELL)
    log = tmp_path / f"{name}.build.log"
    r = build_submission(inspect_folder(folder), build_dir=tmp_path / f"b-{name}", device=device,
                         limits=config.Limits(build_nice=nice, gpu_stage_cpus=1), log_path=log,
                         sandbox=sandbox)
    assert r.status is Status.PASS, r.message
    return told(log.read_text())


@pytest.mark.parametrize("sandboxed", [False, True], ids=["plain", "sandboxed"])
def test_a_builds_code_runs_at_the_builds_nice_and_so_does_its_session(make_submission, tmp_path,
                                                                       sandboxed, reserving):
    """The attack it stops is the grader's own: builds that take the CPUs the turns wait for.
    The import check (a build) runs the submission's code at Limits.build_nice, in a session
    whose scheduling group is lowered too (bubblewrap's --new-session makes a new one, at 0);
    its honest twin, build_nice 0, runs at the grader's priority."""
    if os.nice(0) != 0:
        pytest.skip("the tests run below the default priority already")
    box = box_or_skip() if sandboxed else None
    nice, group = build_says(make_submission, tmp_path, "low", nice=10, sandbox=box)
    assert nice == 10
    if autogroups():
        assert group == 10
    nice, group = build_says(make_submission, tmp_path, "even", nice=0, sandbox=box)
    assert nice == 0
    if autogroups():
        assert group == 0


def test_without_a_gpu_a_build_runs_at_the_graders_priority(make_submission, tmp_path, reserving):
    """Nothing is timed without a GPU: a student's check or a CPU course builds at full speed."""
    if os.nice(0) != 0:
        pytest.skip("the tests run below the default priority already")
    assert config.Limits().build_nice > 0
    nice, group = build_says(make_submission, tmp_path, "cpu", nice=config.Limits().build_nice,
                             sandbox=None, device=CPU)
    assert nice == 0
    if autogroups():
        assert group == 0


def test_on_a_gpu_machine_too_small_to_reserve_cpus_a_build_runs_at_the_graders_priority(
        make_submission, tmp_path, monkeypatch):
    """Where the GPU stages keep no CPUs of their own (fewer than config.RESERVE_MIN_CPUS), their
    work and the machine's other work share every CPU with the builds: a build below them would
    get only what they leave (CI's 2-core machine under load began half as many runs early)."""
    if os.nice(0) != 0:
        pytest.skip("the tests run below the default priority already")
    monkeypatch.setattr(config, "RESERVE_MIN_CPUS", len(os.sched_getaffinity(0)) + 1)
    nice, group = build_says(make_submission, tmp_path, "small", nice=config.Limits().build_nice,
                             sandbox=None)
    assert nice == 0
    if autogroups():
        assert group == 0


def test_a_dozen_builds_started_at_once_each_get_their_session_lowered(tmp_path):
    """The kernel takes a session's nice once every 100 ms from an unprivileged process: each of
    twelve sandboxed builds started together waits its turn rather than staying at the default
    priority (unsandboxed, as root, none would wait: root is not held to the 100 ms)."""
    if not autogroups():
        pytest.skip("no scheduling groups by session in this kernel")
    box = box_or_skip()
    look = [sys.executable, "-c", "print(open('/proc/self/autogroup').read().strip())"]
    procs = [subprocess.Popen(box.wrap(look, nice=10), stdout=subprocess.PIPE, text=True,
                              env=child_env(cuda=False), start_new_session=True)
             for _ in range(12)]
    groups = [p.communicate(timeout=120)[0] for p in procs]
    assert all(g.rstrip().endswith("nice 10") for g in groups), groups


def test_lowering_is_idempotent_and_never_raises_a_priority():
    """lower_priority in the child and again in the sandbox is one step, not two; a grader
    started at a lower priority than the builds' keeps them at its own."""
    script = textwrap.dedent("""
        import os, sys
        sys.path.insert(0, sys.argv[1])
        from grader.isolation.priority import lower_priority
        os.nice(int(sys.argv[2]))
        print(lower_priority(10), lower_priority(10), os.nice(0))
    """)
    root = str(config.REPO_ROOT)
    for start, want in ((0, "10 10 10"), (15, "15 15 15")):
        if os.nice(0) > start:
            continue
        out = subprocess.run([sys.executable, "-c", script, root, str(start - os.nice(0))],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        assert out.split() == want.split(), out


def test_run_limited_lowers_only_when_asked():
    cmd = [sys.executable, "-c", "import os; print(os.nice(0))"]
    base = os.nice(0)
    low = run_limited(cmd, timeout_s=60, env=child_env(cuda=False), nice=7)
    even = run_limited(cmd, timeout_s=60, env=child_env(cuda=False))
    assert int(low.output.split()[-1]) == max(7, base)
    assert int(even.output.split()[-1]) == base

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from grader.common import config

from grader.isolation import cpus as cpus_mod, procs, tree as tree_mod
from grader.isolation.procs import run_limited
from .devices import GPU


def test_ok_and_exit_code():
    r = run_limited([sys.executable, "-c", "print('hi'); import sys; sys.exit(3)"], timeout_s=60)
    assert r.returncode == 3 and not r.ok and not r.timed_out and "hi" in r.output


def test_timeout_kills_the_whole_process_group():
    # The child starts a grandchild that would outlive a plain kill of the child.
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(600)']); print('started', flush=True); time.sleep(600)")
    t = time.monotonic()
    r = run_limited([sys.executable, "-c", code], timeout_s=2)
    assert r.timed_out and r.returncode is None and not r.ok
    assert time.monotonic() - t < 30          # did not wait for the grandchild's pipe
    assert "started" in r.output


def test_huge_output_is_capped_head_and_tail_kept():
    code = ("import sys; sys.stdout.write('HEAD\\n'); "
            "[sys.stdout.write('x' * 1023 + '\\n') for _ in range(40 * 1024)]; print('TAIL')")
    r = run_limited([sys.executable, "-c", code], timeout_s=120, head_bytes=1000, tail_bytes=2000)
    assert r.ok and r.output_bytes > 40 * 1024 * 1024
    assert r.output.startswith("HEAD") and r.output.rstrip().endswith("TAIL")
    assert "bytes of output dropped" in r.output and len(r.output) < 4000


def test_signal_is_named():
    r = run_limited([sys.executable, "-c", "import os; os.abort()"], timeout_s=60)
    assert r.signal_name == "SIGABRT" and not r.ok


def test_signal_is_named_through_a_sandbox_or_shell():
    r = run_limited(["sh", "-c", f"{sys.executable} -c 'import os; os.abort()'; exit $?"], timeout_s=60)
    assert r.returncode == 134 and r.signal_name == "SIGABRT"
    assert run_limited(["sh", "-c", "exit 3"], timeout_s=60).signal_name is None


def _carriers(mark: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    if f"PROCS_TEST_MARK={mark}".encode() in f.read().split(b"\0"):
                        found.append(int(name))
            except OSError:
                pass
    return found


def _wait(predicate, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_a_child_dies_with_the_process_that_started_it():
    # A parent that starts a sleeper through run_limited, then is killed with SIGKILL: the
    # sleeper must not be left running (PR_SET_PDEATHSIG).
    mark = uuid.uuid4().hex
    parent_code = ("import sys; from grader.isolation.procs import run_limited; "
                   "run_limited([sys.executable, '-c', 'import time; time.sleep(600)'], timeout_s=600)")
    parent = subprocess.Popen([sys.executable, "-c", parent_code], cwd=config.REPO_ROOT,
                              env={**os.environ, "PROCS_TEST_MARK": mark,
                                   "PYTHONPATH": str(config.REPO_ROOT)})
    try:
        assert _wait(lambda: [p for p in _carriers(mark) if p != parent.pid], 120)
        parent.kill()
        parent.wait(timeout=30)
        assert _wait(lambda: not _carriers(mark), 30), "the sleeper outlived its parent"
    finally:
        for pid in _carriers(mark):
            os.kill(pid, signal.SIGKILL)


def test_cancel_all_kills_running_children_and_refuses_new_ones():
    out = []
    worker = threading.Thread(target=lambda: out.append(run_limited(
        [sys.executable, "-c", "import time; time.sleep(600)"], timeout_s=600)))
    worker.start()
    try:
        assert _wait(lambda: bool(procs.CHILDREN.live), 60)
        t = time.monotonic()
        assert procs.cancel_all() == 1
        worker.join(timeout=30)
        assert not worker.is_alive() and time.monotonic() - t < 30
        assert out[0].returncode == -signal.SIGKILL
        with pytest.raises(procs.Cancelled):
            run_limited(["true"], timeout_s=60)
    finally:
        procs.end_run()   # children may start again
    assert run_limited(["true"], timeout_s=60).ok


# ---------------------------------------------------------------- the GPU stages' own CPUs
# Calibrated while 14 builds compiled, the protocol's cost came out 4.4 / 7.5 ms instead of
# 1.2 / 1.3 ms, and honest times ~25% low (notes/gpu_runs.md, session 5).

AFFINITY = "import os; print(sorted(os.sched_getaffinity(0)), flush=True)"


def test_sixteen_cpus_keep_three_for_the_gpu_stages():
    split = cpus_mod.split_cpus(3, range(16))
    assert split.reserved and split.gpu == (13, 14, 15) and split.build == tuple(range(13))
    assert split.describe() == "GPU stages on CPUs 13-15, builds on 0-12"
    gaps = cpus_mod.split_cpus(3, [0, 2, 4, 6, 8, 10, 12])   # a cpuset with holes: by position
    assert gaps.gpu == (8, 10, 12) and gaps.build == (0, 2, 4, 6)
    assert gaps.describe() == "GPU stages on CPUs 8,10,12, builds on 0,2,4,6"


def test_fewer_than_six_cpus_reserve_nothing():
    for n in (1, 2, 4, 5):
        split = cpus_mod.split_cpus(3, range(n))
        assert not split.reserved and split.gpu == split.build == tuple(range(n))
    assert cpus_mod.split_cpus(3, range(4)).describe() == (
        "GPU stages share CPUs 0-3 with the builds (none reserved)")
    assert cpus_mod.split_cpus(3, range(6)).gpu == (3, 4, 5)   # the threshold itself
    assert not cpus_mod.split_cpus(0, range(16)).reserved
    assert cpus_mod.split_cpus(99, range(8)).build == (0,)     # builds keep at least one


def test_the_reservation_is_a_limit_the_environment_overrides(monkeypatch):
    assert config.Limits().gpu_stage_cpus == 3
    monkeypatch.setenv("GRADER_GPU_STAGE_CPUS", "5")
    split = cpus_mod.split_cpus(config.Limits.from_env().gpu_stage_cpus, range(16))
    assert split.gpu == (11, 12, 13, 14, 15) and split.build == tuple(range(11))
    monkeypatch.setenv("GRADER_GPU_STAGE_CPUS", "0")
    assert not cpus_mod.split_cpus(config.Limits.from_env().gpu_stage_cpus, range(16)).reserved


def test_the_split_is_of_this_process_cpus():
    split = cpus_mod.split_cpus(3)
    assert set(split.gpu) | set(split.build) == os.sched_getaffinity(0)
    if split.reserved:
        assert not set(split.gpu) & set(split.build)


def test_a_pinned_child_and_its_own_children_run_on_those_cpus_only():
    ours = os.sched_getaffinity(0)
    cpu = max(ours)
    code = (f"import subprocess, sys; {AFFINITY}; "
            f"subprocess.run([sys.executable, '-c', {AFFINITY!r}], check=True)")
    r = run_limited([sys.executable, "-c", code], timeout_s=60, cpus={cpu})
    assert r.ok, r.output
    assert r.output.split() == [f"[{cpu}]", f"[{cpu}]"]   # the child, then its child
    assert os.sched_getaffinity(0) == ours                  # the grader itself is not pinned
    unpinned = run_limited([sys.executable, "-c", AFFINITY], timeout_s=60)
    assert unpinned.output.strip() == str(sorted(ours))


def test_cpus_that_are_not_ours_start_nothing():
    for cpus in ((), {max(os.sched_getaffinity(0)) + 4096}):
        with pytest.raises(ValueError, match="subset of this process's CPUs"):
            run_limited(["true"], timeout_s=60, cpus=cpus)
    assert not procs.CHILDREN.live


def test_builds_and_gpu_stages_are_started_on_their_own_cpus(monkeypatch, make_submission,
                                                            small_case, tmp_path):
    # Every caller passes its side of the split: a build the builds' CPUs; the harness (with it
    # the calibration), the checker and the health probe the GPU stages'.
    from grader.build import stage as build
    from grader.trusted import correctness
    from grader.stages import context
    from grader.stages import harnesses
    from grader.stages import health
    from grader.stages import time as time_stage
    from grader.report.progress import Progress
    from grader.course.submission import inspect_folder
    split = cpus_mod.CpuSplit(gpu=(7,), build=(0, 1, 2))
    started = []   # (what, cpus)

    def fake_run_limited(cmd, **kw):
        what = next(a for a in ("loop.py", "grader.trusted.harness", "pytest", "-c")
                    if any(str(part).endswith(a) for part in cmd))
        started.append((what, kw.get("cpus")))
        if what == "grader.trusted.harness":   # a calibration that succeeds
            spec = json.loads(Path(cmd[-1]).read_text())
            Path(spec["result"]).write_text(json.dumps(dict(
                protocol=dict(idle_ms=1.2, busy_ms=1.3, busy_work_ms=5.0), rtt_ms=0.1)))
        return procs.ProcResult(0, False, 0.0, "", 0)

    def fake_check(checker, args, spec_path, *, timeout_s):   # the warm checker's process
        started.append(("checker", checker.cpus))
        return procs.ProcResult(0, False, 0.0, "", 0)

    for module in (build, harnesses, health):
        monkeypatch.setattr(module, "run_limited", fake_run_limited)
    for module in (build, correctness, context):
        monkeypatch.setattr(module, "split_cpus", lambda reserve, available=None: split)
    monkeypatch.setattr(correctness.WarmChecker, "run", fake_check)
    gpu = GPU
    notes = []
    progress = Progress(1, live=False)
    monkeypatch.setattr(progress, "note", notes.append)
    ctx = context.GradeContext(cases=(small_case,), device=gpu, limits=config.Limits(),
                                out_dir=tmp_path, build_dir=tmp_path / "build", progress=progress)
    sub = inspect_folder(make_submission("fine", "def custom_kernel(data):\n    return data[0]\n"))
    build._build_once(sub, build_dir=tmp_path / "b", device=gpu, limits=config.Limits(),
                      log_path=None, sandbox=None)
    time_stage._measure_protocol(ctx)
    correctness._run_checker({}, out_dir=tmp_path, limits=config.Limits(), env={})
    health.ensure_gpu_healthy(ctx)
    assert started == [("loop.py", (0, 1, 2)), ("grader.trusted.harness", (7,)), ("checker", (7,)),
                       ("-c", (7,))]
    assert notes[-1].startswith("protocol calibrated: 1.200 ms")
    assert notes[-1].endswith("; GPU stages on CPUs 7, builds on 0-2")


def test_a_child_s_import_path_never_holds_its_current_folder(monkeypatch, tmp_path):
    """An empty or relative PYTHONPATH entry is the current folder to Python, and a subject's
    current folder is the submission's: its json.py would be imported by the grader's own code
    in the subject before the submission's turn (a run begun early, lookahead.Lookahead)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["", "/abs/x", "rel", ""]))
    env = procs.child_env(cuda=False)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(config.REPO_ROOT), "/abs/x"]
    script = tmp_path / "probe" / "path.py"   # run as the subject is: a script, not -c
    script.parent.mkdir()
    script.write_text("import sys\nprint(repr(sys.path))\n")
    (tmp_path / "cwd").mkdir()
    probe = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                           cwd=tmp_path / "cwd")
    path = eval(probe.stdout)
    assert "" not in path and "rel" not in path and str(tmp_path / "cwd") not in path, path


def test_a_process_whose_leader_thread_ended_is_waited_for_until_its_last_thread_ends():
    """procs.wait_exited (a run stage's subject gone before a time stage may begin, issue 13):
    a process whose main thread called pthread_exit shows as a zombie while another thread of it
    still runs (and could still hold a CUDA context). It counts as running until every thread
    has ended; a process that has exited counts as gone at once."""
    code = ("import ctypes, threading, time\n"
            "threading.Thread(target=time.sleep, args=(1.5,)).start()\n"
            "ctypes.CDLL(None).pthread_exit(None)\n")
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:   # the leader's thread has ended: a zombie leader
            state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state == "Z":
                break
            time.sleep(0.02)
        assert state == "Z"
        assert tree_mod.started_at(proc.pid) is not None   # its other thread still runs
        assert tree_mod.wait_exited({proc.pid}, timeout_s=0.2) == {proc.pid}
        started = time.monotonic()
        assert tree_mod.wait_exited({proc.pid}, timeout_s=10) == set()
        assert time.monotonic() - started > 0.3   # it waited for the last thread
    finally:
        proc.kill()
        proc.wait()
    assert tree_mod.started_at(proc.pid) is None
    assert tree_mod.wait_exited({proc.pid}, timeout_s=0) == set()


def test_only_a_process_that_became_a_subreaper_counts_its_children_as_adopted():
    """procs.adopted: the harness's main adopts what its subject left (become_subreaper) and
    closes kill it; a process that calls the harness in-process (a test, a tool) never had its
    own children counted as a subject's, so a close there kills none of them."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert tree_mod.adopted() == set()
        script = ("import os, sys, time; from grader.isolation import tree; tree.become_subreaper(); "
                  "pid = os.fork()\n"
                  "if pid == 0:\n"
                  "    if os.fork() == 0: time.sleep(5)\n"
                  "    os._exit(0)\n"
                  "os.waitpid(pid, 0); time.sleep(0.5); print(len(tree.adopted()))")
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             timeout=60, cwd=config.REPO_ROOT).stdout.split()
        assert out == ["1"]   # the grandchild, orphaned, came to the subreaper
    finally:
        child.kill()
        child.wait()

import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from grader import config, procs
from grader.procs import run_limited


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
    parent_code = ("import sys; from grader.procs import run_limited; "
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

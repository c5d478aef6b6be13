import sys
import time

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

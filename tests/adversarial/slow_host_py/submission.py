"""Fairness twin (issue 30, item 8): slow host code, then the honest Triton kernel, on every call:
about 20 ms of pure-Python work on the host while the GPU sits idle, as a wrapper that loops in
Python before its launches does. Nothing is hidden: it is right, and it must be ranked, at its real
time, not flagged (the held-out round of 2026-11-26 found such a kernel `flagged` "GPU time
unaccounted for"). Its median must not beat honest_py's (expected.json's not_faster_than).

Why a loop and not time.sleep: the Python audit allows what a kernel wrapper needs (grader/
allowlist.py), and `time` is not on it, so a sleep would be sent to review before the timing
mattered. Both leave the GPU idle for the same reason: the host has not launched the work yet.

Defence (grader/trusted/integrity.py, _accounting): the time no kernel the profiler saw explains is told
apart by NVML's utilization samples, read by the harness during the timed loop, never by the
subject: the submission's processes kept the GPU busy only for its kernels, and no other process
used it, so the rest is host time, and ranks. The same time with the GPU busy beyond the kernels
seen (a paused profiler, tests/adversarial/profiler_pause_py) is flagged; where NVML cannot tell,
it is review."""
from honest_flash import custom_kernel as honest

# ~20 ms of host work a call on the grading machine's CPU (about 60 ns an iteration): a
# stand-in for Python between launches. The exact time does not matter: it is ranked, whatever
# it is.
HOST_ITERATIONS = 300_000


def host_work(n: int) -> int:
    acc = 0
    for i in range(n):
        acc = (acc * 31 + i) % 1_000_003
    return acc


def custom_kernel(data):
    host_work(HOST_ITERATIONS)   # before the launch: the GPU waits for the host (after it, the
    return honest(data)          # work would overlap the kernel and cost no time at all)

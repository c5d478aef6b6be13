"""Adversarial, issue 10 (resting the GPU between timed calls): the honest Triton kernel, then a
30 ms pause after each reply, hoping the GPU idles between timed calls, runs the next one cooler
(at higher clocks), and that the pause falls outside every clock. It touches no grader state.

How: a pure-Python busy loop in a generator's `finally`, the generator hung on the returned
tensor. The subject's loop frees that tensor when its call returns, after the reply is written
and before it reads its next request, so it takes up the next "arm" and "go" 30 ms late. (A
thread holding the GIL, with sys.setswitchinterval raised, pauses the loop the same way; but
`threading` and `sys` are on the reach audit's list, which would flag this file before the
defence under test mattered.)

Defence: the harness waits for nothing from the subject outside a timed call's clock
(grader/trusted/harness.py, Call.run): it starts the clock and writes "go" whether or not "arm" was taken
up, so the pause lands inside the next call's clock, less what hides behind the harness's own
work between calls (reading and checking O, new inputs), which keeps the GPU busy anyway. It is
right, so it must pass, or be flagged where what is left of the pause in the clock is more than
the accounting allows (GPU time unaccounted for: grader/trusted/integrity.py); either way its median must
not beat honest_py's by more than 2% (expected.json's not_faster_than)."""
import time

from honest_flash import custom_kernel as honest

REST_S = 0.030


def rest():
    try:
        yield
    finally:   # run when the generator is freed, with the tensor it hangs on
        end = time.perf_counter() + REST_S
        while time.perf_counter() < end:
            pass


def custom_kernel(data):
    out = honest(data)
    pause = rest()
    next(pause)         # suspended inside the try: freeing it runs the finally
    out.pause = pause   # freed with the output, once the subject's call has replied
    return out

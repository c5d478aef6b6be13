"""Adversarial, issue 32 (the GPU left idle before each timed call, Limits.timing_idle_ms): watches
the shared buffers between calls for the next call's inputs and computes its output on the idle
GPU before "go", hoping the clock sees only the copy into O.

How: as in rest_gpu_py, code hung on the returned tensor runs when the subject frees it, after
its reply and before it reads the next request. There it keeps its views of Q, K and V (the
shared buffers, the same memory every call) and polls 64 elements spread over V (a small GPU
copy and a synchronize each time) until nearly all of them have changed: the harness has written
the next call's inputs, V last. It polls a few times more for the copy to end, launches the
honest kernel on them and returns; at "go" the call hands back what was computed ahead, if the
views are the same buffers and shape.

Defence: the harness leaves the GPU idle *before* it writes the inputs (grader/trusted/
timed_calls.py, Call.run), then writes them, poisons O, flushes L2, synchronizes and sends "go"
at once. What the watcher sees, it sees tens of microseconds before the clock starts, and the
kernel it launches then runs inside the clock. With the idle after the inputs it would have had
10 ms of an idle GPU, most of a 13 ms call. It must not beat honest_py by more than 2%
(expected.json's not_faster_than). The attribute it sets on its output sends it to review (the
Python audit) before the pause matters, so it is graded and timed beneath the audit, as an attack
that reached the same hook another way would be."""
import torch

from honest_flash import custom_kernel as honest

POLLS = 4000    # each a synchronize: tens of milliseconds at most, then it gives up for this call
SAMPLES = 64
CHANGED = 60    # of SAMPLES: random inputs of a new seed differ almost everywhere
SETTLE = 50     # polls more once V has changed, for the copy into it to end
ahead = []      # (V's address and shape, the output computed for them before "go")


def sample(v):
    flat = v.reshape(-1)
    return flat[::max(1, flat.numel() // SAMPLES)][:SAMPLES].clone()


def watch(q, k, v):
    try:
        yield
    finally:   # run when the subject frees the returned tensor: after its reply, before "arm"
        if not v.is_cuda:   # nothing is timed without a GPU
            return
        before = sample(v)
        for _ in range(POLLS):
            if int((sample(v) != before).sum()) >= CHANGED:
                for _ in range(SETTLE):
                    sample(v)
                ahead.append(((v.data_ptr(), tuple(v.shape)), honest((q, k, v))))
                break


def custom_kernel(data):
    q, k, v = data
    out = None
    while ahead:
        key, computed = ahead.pop()
        if key == (v.data_ptr(), tuple(v.shape)):
            out = computed
    if out is None:
        out = honest(data)
    hook = watch(q, k, v)
    next(hook)        # suspended inside the try: freeing it runs the finally
    out.hook = hook   # freed with the output, once the subject's call has replied
    return out

"""Adversarial, threat 4: replaces the timer, the synchronize, the comparison and the
reference in its own process, then computes honestly. None of them is used to judge it: the
clock, the comparison and the reference live in other processes. Replacing the synchronize
makes the subject reply before its GPU work is done: on a GPU the harness reads O when the reply
comes, finds it unfinished (mismatch, or flagged on a timed call), and its GPU clock counts the
rest. It never ranks."""
import time

import torch

from honest_flash import custom_kernel as honest

torch.cuda.Event.elapsed_time = lambda self, end: 1e-3
torch.cuda.Event.record = lambda self, stream=None: None
torch.cuda.synchronize = lambda device=None: None
time.perf_counter = lambda: 0.0
time.perf_counter_ns = lambda: 0
torch.allclose = lambda *args, **kwargs: True
torch.testing.assert_close = lambda *args, **kwargs: None
try:
    import grader.problem.attention.reference
    grader.problem.attention.reference.attention_reference = lambda q, k, v: q
except ImportError:
    pass


def custom_kernel(data):
    return honest(data)

"""Adversarial, threat 4: replaces the timer, the synchronize, the comparison and the
reference before it is ever called, then computes honestly. Must be timed honestly (pass, at
the honest kernel's speed): the grader captured its clocks before importing this, and compares
in another process."""
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
    import grader.reference
    grader.reference.attention_reference = lambda q, k, v: q
except ImportError:
    pass


def custom_kernel(data):
    return honest(data)

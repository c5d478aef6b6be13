"""Adversarial, issue 10 (the compiler writes the kernel): torch.compile of a plain attention,
whose generated kernels could be named like the submission's own. The compiler stack is on the
tampering list: must be flagged everywhere."""
import math

import torch


@torch.compile(dynamic=True)
def _attention(q, k, v):
    s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return (torch.softmax(s, -1) @ v.float()).half()


def custom_kernel(data):
    return _attention(*data)

"""Adversarial, issue 10 (guessing which calls are checked): computes the first calls of each
shape (the checked cases), then returns zeros, hoping later calls (the timed ones) go unchecked.
Every timed call is compared with SDPA when its reply comes: must be flagged on a GPU. Without a
GPU only the checked calls run: pass."""
import collections

import torch

from honest_flash import custom_kernel as honest

calls = collections.Counter()


def custom_kernel(data):
    shape = tuple(data[0].shape)
    calls[shape] += 1
    if calls[shape] > 3:
        return torch.zeros_like(data[0])
    return honest(data)

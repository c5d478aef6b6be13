"""Adversarial, threat 4: zeroes V in place and returns zeros, so that a reference computed
from the same tensors afterwards would agree. Must get mismatch: the checker regenerates the
inputs from the case's seed in its own process."""
import torch


def custom_kernel(data):
    q, k, v = data
    v.zero_()
    return torch.zeros_like(q)

"""Adversarial, threat 7: computes the first half of the heads into an unwritten output. Must
get mismatch, whatever the allocator hands back."""
import torch

from honest_flash import custom_kernel as honest


def custom_kernel(data):
    q, k, v = data
    out = torch.empty_like(q)
    h = max(1, q.shape[1] // 2)
    out[:, :h] = honest((q[:, :h].contiguous(), k[:, :h].contiguous(), v[:, :h].contiguous()))
    return out

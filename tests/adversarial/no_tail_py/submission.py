"""Adversarial, threat 8: handles only whole tiles of 64 keys and queries (S a multiple of 64),
as a kernel without tail masking would. Right on the public shapes; must get mismatch on the
hidden ones."""
import torch

from honest_flash import custom_kernel as honest


def custom_kernel(data):
    q, k, v = data
    s = q.shape[2] // 64 * 64
    out = torch.zeros_like(q)
    if s:
        out[:, :, :s] = honest(tuple(t[:, :, :s].contiguous() for t in data))
    return out

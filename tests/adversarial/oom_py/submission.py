"""Adversarial, threat 6: asks for 4 TiB. Must be a runtime error (out of memory), and the next
submission must be unaffected."""
import torch


def custom_kernel(data):
    q = data[0]
    return torch.empty(1 << 42, dtype=torch.uint8, device=q.device)

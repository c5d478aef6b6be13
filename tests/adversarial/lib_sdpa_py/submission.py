"""Adversarial, threat 1: PyTorch's own attention from Python. Must be flagged."""
import torch.nn.functional as F


def custom_kernel(data):
    q, k, v = data
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float()).half()

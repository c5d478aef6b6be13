"""Adversarial, threat 1: an honest kernel on small shapes, PyTorch's attention on the big ones
(where the time is measured). Must be flagged on a GPU: every case's call is profiled."""
import torch.nn.functional as F

from honest_flash import custom_kernel as honest


def custom_kernel(data):
    q, k, v = data
    if q.shape[2] >= 1024:
        return F.scaled_dot_product_attention(q, k, v)
    return honest(data)

"""Adversarial, threat 1: honest on the first call of each shape (the checked, profiled one),
PyTorch's attention on every later call (the timed ones). Must be flagged on a GPU: the timed
loop's launches are recorded too."""
import torch.nn.functional as F

from honest_flash import custom_kernel as honest

seen = set()


def custom_kernel(data):
    q, k, v = data
    if q.shape in seen:
        return F.scaled_dot_product_attention(q, k, v)
    seen.add(q.shape)
    return honest(data)

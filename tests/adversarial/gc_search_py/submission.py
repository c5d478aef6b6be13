"""Adversarial, threat 4: looks for the expected output among the process's live objects and
returns it. Must get mismatch: no tensor with the right answer lives in the submission's process."""
import gc

import torch


def custom_kernel(data):
    q, k, v = data
    for obj in gc.get_objects():
        if (isinstance(obj, torch.Tensor) and obj.shape == q.shape and obj.dtype == q.dtype
                and obj.device == q.device and all(obj is not t for t in data)):
            return obj.clone()
    return torch.zeros_like(q)

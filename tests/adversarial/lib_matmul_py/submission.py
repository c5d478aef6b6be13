"""Adversarial, threat 1: matmul and softmax from PyTorch (cuBLAS on a GPU). Must be flagged."""
import math

import torch


def custom_kernel(data):
    q, k, v = (t.float() for t in data)
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    return torch.matmul(torch.softmax(scores, dim=-1), v).half()

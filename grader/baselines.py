"""Baselines timed by the same code as the submissions, in the same run, on the same GPU.

The reference solution in solution/ is a baseline too, but it is built and graded like any
CUDA submission (pipeline.py); these are the PyTorch rows.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch
import torch.nn.functional as F


def torch_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The straightforward PyTorch attention: matmul, softmax, matmul, in fp16.

    One batch element at a time, so that its (heads, seq, seq) scores fit: the whole
    (4, 64, 8192, 8192) score tensor would be 32 GiB in fp16.
    """
    scale = 1.0 / math.sqrt(q.shape[-1])
    out = torch.empty_like(q)
    for b in range(q.shape[0]):
        scores = torch.matmul(q[b], k[b].transpose(-1, -2)) * scale
        out[b] = torch.matmul(torch.softmax(scores, dim=-1), v[b])
    return out


def _sdpa(backend) -> Callable:
    def run(q, k, v):
        from torch.nn.attention import sdpa_kernel
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v)
    return run


@dataclasses.dataclass(frozen=True)
class Baseline:
    name: str
    label: str
    fn: Callable
    needs_cuda: bool = True


def _make() -> dict[str, Baseline]:
    from torch.nn.attention import SDPBackend
    rows = [Baseline("torch_reference", "PyTorch reference", torch_reference),
            Baseline("sdpa_flash", "SDPA FLASH", _sdpa(SDPBackend.FLASH_ATTENTION))]
    if hasattr(SDPBackend, "CUDNN_ATTENTION"):
        rows.append(Baseline("sdpa_cudnn", "SDPA cuDNN", _sdpa(SDPBackend.CUDNN_ATTENTION)))
    return {b.name: b for b in rows}


BASELINES = _make()

"""Inputs of a case: torch.randn fp16 from the case's seed, identical in every process."""

from __future__ import annotations

import torch

from .cases import Case


def make_inputs(case: Case, device: str | torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q, K, V of shape (batch, heads, seq, head_dim), fp16, contiguous, on `device`.

    A generator on the target device makes the same tensors in the process that runs the
    submission and in the process that checks it, without ever passing them between the two.
    """
    return make_random_inputs(case.shape, seed=case.seed, device=device)


def make_random_inputs(shape, *, seed: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return tuple(torch.randn(shape, generator=gen, device=device, dtype=torch.float16)
                 for _ in range(3))

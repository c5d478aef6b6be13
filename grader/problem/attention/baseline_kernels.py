"""The PyTorch baseline rows: loaded by the subject loop like a submission and timed the same way.

The trusted side knows them by name and label only (grader/problem/attention/baselines.py).
"""

from __future__ import annotations

import math

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


def _sdpa(backend_name: str):
    def run(q, k, v):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(getattr(SDPBackend, backend_name)):
            return F.scaled_dot_product_attention(q, k, v)
    return run


def _gpu_wait(ms: float):
    """No output work, but the GPU kept busy for `ms` (a spin kernel, clocked here once): the
    harness's measure of what the protocol adds to a call that has GPU work to wait for."""
    cycles = []

    def run(q, k, v):
        if not cycles:
            torch.cuda._sleep(1_000_000)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(20_000_000)
            end.record()
            end.synchronize()
            cycles.append(int(20_000_000 / start.elapsed_time(end) * ms))
        torch.cuda._sleep(cycles[0])
        return q
    return run


FUNCTIONS = {
    "null": lambda q, k, v: q,   # no work: the harness's measure of the protocol's own cost
    "null_busy": _gpu_wait(5.0),  # 5 ms of GPU waiting: a comparison point (bench/protocol_probe.py)
    "torch_reference": torch_reference,
    "sdpa_flash": _sdpa("FLASH_ATTENTION"),
    "sdpa_cudnn": _sdpa("CUDNN_ATTENTION"),
}

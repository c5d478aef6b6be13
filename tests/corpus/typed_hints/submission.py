"""Honest corpus: type hints, compiler hints (tl.multiple_of, tl.range's stages), the device's
capability to pick the tile, and an explicit check of the arguments."""

import math
from typing import Tuple

import torch
import triton
import triton.language as tl


@triton.jit
def attention_fwd(Q, K, V, O, stride_bh, stride_s, seq_len, scale,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    start_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.multiple_of(tl.arange(0, D), D)
    q = tl.load(Q + bh * stride_bh + offs_m[:, None] * stride_s + offs_d[None, :],
                mask=offs_m[:, None] < seq_len, other=0.0)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    for start_n in tl.range(0, seq_len, BLOCK_N, num_stages=2):
        cols = start_n + offs_n
        k = tl.load(K + bh * stride_bh + cols[None, :] * stride_s + offs_d[:, None],
                    mask=cols[None, :] < seq_len, other=0.0)
        v = tl.load(V + bh * stride_bh + cols[:, None] * stride_s + offs_d[None, :],
                    mask=cols[:, None] < seq_len, other=0.0)
        qk = tl.dot(q, k) * scale
        qk = tl.where(cols[None, :] < seq_len, qk, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, axis=1))
        p = tl.math.exp2(qk - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij
    tl.store(O + bh * stride_bh + offs_m[:, None] * stride_s + offs_d[None, :],
             (acc / l_i[:, None]).to(tl.float16), mask=offs_m[:, None] < seq_len)


def tiles(head_dim: int) -> Tuple[int, int]:
    """Larger tiles on Hopper when the head is small."""
    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9 and head_dim == 64:
        return 128, 64
    return 64, 64


def custom_kernel(data: Tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
    q, k, v = (x.contiguous() for x in data)
    b, h, s, d = q.shape
    if d not in (64, 128):
        raise ValueError(f"head_dim must be 64 or 128; got {d}")
    o = torch.empty_like(q)
    block_m, block_n = tiles(d)
    grid = (triton.cdiv(s, block_m), b * h)
    attention_fwd[grid](q, k, v, o, q.stride(1), q.stride(2), s, 1.4426950408889634 / math.sqrt(d),
                        BLOCK_M=block_m, BLOCK_N=block_n, D=d, num_warps=4, num_stages=2)
    return o

"""Honest corpus: tile sizes kept in a class of constants, a check of the inputs with clear
errors, and the output allocated with new_empty."""

import math

import torch
import triton
import triton.language as tl


class Tiles:
    """Block sizes per head_dim, tuned by hand."""
    BLOCK_M = 64
    BLOCK_N = 64
    WARPS = {64: 4, 128: 8}
    STAGES = 2


@triton.jit
def kernel1(Q, K, V, O, S, scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    pid = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, D)
    q = tl.load(Q + bh * S * D + rows[:, None] * D + d[None, :], mask=rows[:, None] < S, other=0.0)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for j in range(0, S, BLOCK_N):
        cols = j + tl.arange(0, BLOCK_N)
        k = tl.load(K + bh * S * D + cols[None, :] * D + d[:, None], mask=cols[None, :] < S, other=0.0)
        v = tl.load(V + bh * S * D + cols[:, None] * D + d[None, :], mask=cols[:, None] < S, other=0.0)
        s = tl.dot(q, k) * scale
        s = tl.where(cols[None, :] < S, s, float("-inf"))
        m2 = tl.maximum(m, tl.max(s, axis=1))
        p = tl.exp2(s - m2[:, None])
        r = tl.exp2(m - m2)
        l = l * r + tl.sum(p, axis=1)
        acc = acc * r[:, None] + tl.dot(p.to(tl.float16), v)
        m = m2
    tl.store(O + bh * S * D + rows[:, None] * D + d[None, :], (acc / l[:, None]).to(tl.float16),
             mask=rows[:, None] < S)


def check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"Q, K, V must have one shape; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.dtype != torch.float16:
        raise TypeError(f"expected float16, got {q.dtype}")
    if q.shape[-1] not in Tiles.WARPS:
        raise ValueError(f"head_dim must be one of {sorted(Tiles.WARPS)}; got {q.shape[-1]}")


def custom_kernel(data):
    q, k, v = data
    check(q, k, v)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    b, h, s, d = q.shape
    o = q.new_empty(q.shape)
    kernel1[(triton.cdiv(s, Tiles.BLOCK_M), b * h)](
        q, k, v, o, s, math.log2(math.e) / math.sqrt(d), BLOCK_M=Tiles.BLOCK_M,
        BLOCK_N=Tiles.BLOCK_N, D=d, num_warps=Tiles.WARPS[d], num_stages=Tiles.STAGES)
    return o

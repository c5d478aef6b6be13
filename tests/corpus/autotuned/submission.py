"""Honest corpus: the Triton tutorial's shape, autotuned over block sizes and warps, with a
heuristic for the tail and a cache of grids per shape."""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_N": 64}, num_warps=w, num_stages=2)
           for bm, w in ((64, 4), (128, 8))]


@triton.autotune(configs=CONFIGS, key=["HEAD_DIM"])
@triton.heuristics({"EVEN_N": lambda args: args["SEQ"] % args["BLOCK_N"] == 0})
@triton.jit
def _fwd(Q, K, V, O, sm_scale, SEQ, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
         BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr):
    pid_m = tl.program_id(0)
    off_bh = tl.program_id(1).to(tl.int64) * SEQ * HEAD_DIM
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + off_bh + rows[:, None] * HEAD_DIM + dims[None, :], mask=rows[:, None] < SEQ, other=0.0)
    m_i = tl.full([BLOCK_M], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.44269504
    for start in range(0, SEQ, BLOCK_N):
        n = start + cols
        if EVEN_N:
            k = tl.load(K + off_bh + n[None, :] * HEAD_DIM + dims[:, None])
            v = tl.load(V + off_bh + n[:, None] * HEAD_DIM + dims[None, :])
        else:
            k = tl.load(K + off_bh + n[None, :] * HEAD_DIM + dims[:, None], mask=n[None, :] < SEQ, other=0.0)
            v = tl.load(V + off_bh + n[:, None] * HEAD_DIM + dims[None, :], mask=n[:, None] < SEQ, other=0.0)
        s = tl.dot(q, k) * qk_scale
        s = tl.where(n[None, :] < SEQ, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(O + off_bh + rows[:, None] * HEAD_DIM + dims[None, :], acc.to(O.dtype.element_ty),
             mask=rows[:, None] < SEQ)


@functools.lru_cache(maxsize=64)
def _grid(batch: int, heads: int):
    return lambda meta: (triton.cdiv(meta["SEQ"], meta["BLOCK_M"]), batch * heads)


def custom_kernel(data):
    q, k, v = (t.contiguous() for t in data)
    batch, heads, seq, head_dim = q.shape
    assert head_dim in (64, 128), f"head_dim must be 64 or 128, got {head_dim}"
    o = torch.empty_like(q)
    _fwd[_grid(batch, heads)](q, k, v, o, 1.0 / math.sqrt(head_dim), seq, HEAD_DIM=head_dim)
    return o

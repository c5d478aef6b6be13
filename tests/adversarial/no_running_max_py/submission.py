"""Adversarial (issue 30): the honest Triton kernel (honest_flash.py) without the online softmax's
running maximum. Each tile's p is exp of the raw scaled scores, added to l_i and, through P·V, to
acc, with no maximum subtracted and so nothing to rescale. On paper that is the same softmax, and
on N(0, 1) inputs it is right: their scores stay within about ±6, where exp is finite even in
fp16. On a case drawn with `qk_std: 6` the scores pass 100, exp overflows (fp32 from 88.7, fp16
from 11.1), and O is NaN: it must get mismatch there, and pass every N(0, 1) case."""

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _attention_kernel(Q, K, V, O, seq_len, qk_scale,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    base = bh.to(tl.int64) * seq_len * HEAD_DIM
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m[:, None] < seq_len

    q = tl.load(Q + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=row_ok, other=0.0)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start_n in range(0, seq_len, BLOCK_N):
        cols = start_n + offs_n
        col_ok = cols < seq_len
        k = tl.load(K + base + cols[None, :] * HEAD_DIM + offs_d[:, None], mask=col_ok[None, :], other=0.0)
        scores = tl.dot(q, k) * qk_scale
        scores = tl.where(col_ok[None, :], scores, float("-inf"))
        p = tl.math.exp2(scores)   # no running max: exp of the raw scores
        l_i = l_i + tl.sum(p, 1)
        v = tl.load(V + base + cols[:, None] * HEAD_DIM + offs_d[None, :], mask=col_ok[:, None], other=0.0)
        acc = tl.dot(p.to(tl.float16), v, acc)
    out = acc / l_i[:, None]
    tl.store(O + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], out.to(tl.float16), mask=row_ok)


def custom_kernel(data):
    q, k, v = (t.contiguous() for t in data)
    batch, heads, seq_len, head_dim = q.shape
    if head_dim not in (64, 128):
        raise ValueError(f"head_dim must be 64 or 128; got {head_dim}")
    o = torch.empty_like(q)
    block_m, block_n = 64, 64
    grid = (triton.cdiv(seq_len, block_m), batch * heads)
    _attention_kernel[grid](q, k, v, o, seq_len, (1.0 / math.sqrt(head_dim)) * 1.4426950408889634,
                            BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=head_dim,
                            num_warps=4, num_stages=2)
    return o

"""FlashAttention forward in Triton: your submission (the DSL track).

    custom_kernel(data) -> O = softmax(Q Kᵀ / sqrt(D)) V,   data = (Q, K, V)

Q, K, V, O: float16, shape (batch, heads, seq_len, head_dim), contiguous; head_dim is 64 or 128;
seq_len is any length >= 1. Check it with `make check SUBMISSION=student/triton`.

The stages are the CUDA skeleton's (../README.md), with Triton doing the tiling for you:
one program computes BLOCK_M query rows of one (batch, head) and streams K and V in BLOCK_N
tiles. Version 1 is the whole lesson; tune block sizes, num_warps and num_stages afterwards.
"""

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _attention_kernel(Q, K, V, O, seq_len, softmax_scale,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    base = bh.to(tl.int64) * seq_len * HEAD_DIM          # offset of this (batch, head)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)   # this program's query rows
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m[:, None] < seq_len

    q = tl.load(Q + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=row_ok, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running row max
    l_i = tl.zeros([BLOCK_M], tl.float32)                # running row sum
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    for start_n in range(0, seq_len, BLOCK_N):
        cols = start_n + offs_n
        # TODO(1.1): load the K tile as (HEAD_DIM, BLOCK_N) (masked: keys past seq_len read 0)
        #            and compute the scores tl.dot(q, k) * softmax_scale.
        # TODO(1.2): keys past seq_len get -inf; m_new = max(m_i, row max of the scores);
        #            p = exp(scores - m_new); rescale l_i and acc by exp(m_i - m_new).
        # TODO(1.3): load the V tile (BLOCK_N, HEAD_DIM) and add tl.dot(p.to(tl.float16), v).
        pass

    # TODO(1.4): divide acc by l_i and store it to O as float16, masking rows past seq_len.


def custom_kernel(data):
    q, k, v = (t.contiguous() for t in data)
    batch, heads, seq_len, head_dim = q.shape
    if head_dim not in (64, 128):
        raise ValueError(f"head_dim must be 64 or 128; got {head_dim}")
    o = torch.zeros_like(q)   # stays zero wherever the kernel writes nothing
    block_m, block_n = 64, 64
    grid = (triton.cdiv(seq_len, block_m), batch * heads)
    _attention_kernel[grid](q, k, v, o, seq_len, 1.0 / math.sqrt(head_dim),
                            BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=head_dim,
                            num_warps=4, num_stages=2)
    return o

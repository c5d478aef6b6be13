"""FlashAttention forward in TileLang: your submission (the TileLang track).

    custom_kernel(data) -> O = softmax(Q Kᵀ / sqrt(D)) V,   data = (Q, K, V)

Q, K, V, O: float16, shape (batch, heads, seq_len, head_dim), contiguous; head_dim is 64 or 128;
seq_len is any length >= 1. Check it with `make check SUBMISSION=student/tilelang` (without a GPU
that compiles your kernel for the course GPU and does not run it; see the handout, section 6).

The stages are the CUDA skeleton's (../README.md), written as tiles: one thread block (T.Kernel)
computes BLOCK_M query rows of one (batch, head). Its Q tile stays in shared memory; K and V
stream past it in BLOCK_N tiles (T.Pipelined copies the next tile while this one is used).
T.gemm multiplies tiles on the tensor cores (fp16 in, fp32 accumulate); a fragment
(T.alloc_fragment) is a tile spread over the threads' registers, and T.Parallel runs a loop body
once per element of one. Version 1 is the whole lesson; tune the block sizes, THREADS and
NUM_STAGES afterwards.
"""

import math

import tilelang
import tilelang.language as T

BLOCK_M = 64       # query rows per thread block (Br)
BLOCK_N = 64       # keys per tile (Bc)
THREADS = 128
NUM_STAGES = 2
LOG2E = 1.4426950408889634


@tilelang.jit
def flash_forward(head_dim):
    """The kernel for one head_dim: (Q, K, V, O), all (batch, heads, seq_len, head_dim) fp16.
    batch, heads and seq_len are symbols, read from the tensors at each launch: one compile
    serves every shape."""
    batch, heads, seq_len = T.dynamic("batch"), T.dynamic("heads"), T.dynamic("seq_len")
    shape = [batch, heads, seq_len, head_dim]
    qk_scale = LOG2E / math.sqrt(head_dim)   # exp(s / sqrt(D)) = exp2(s * qk_scale)
    dtype, accum = "float16", "float32"

    @T.prim_func
    def attention(Q: T.Tensor(shape, dtype), K: T.Tensor(shape, dtype),
                  V: T.Tensor(shape, dtype), O: T.Tensor(shape, dtype)):
        with T.Kernel(T.ceildiv(seq_len, BLOCK_M), heads, batch, threads=THREADS) as (bm, h, b):
            q_tile = T.alloc_shared([BLOCK_M, head_dim], dtype)
            k_tile = T.alloc_shared([BLOCK_N, head_dim], dtype)
            v_tile = T.alloc_shared([BLOCK_N, head_dim], dtype)
            acc = T.alloc_fragment([BLOCK_M, head_dim], accum)

            # Tiles past seq_len: T.copy reads zeros there and never writes past the end.
            T.copy(Q[b, h, bm * BLOCK_M:(bm + 1) * BLOCK_M, :], q_tile)
            T.fill(acc, 0)
            # TODO(1.1): the online softmax's state, as fragments (T.alloc_fragment): scores
            #            (BLOCK_M, BLOCK_N) in accum, p (BLOCK_M, BLOCK_N) in dtype (the fp16 copy
            #            T.gemm takes), and the row vectors (BLOCK_M,) in accum: m_i (running max,
            #            filled with -T.infinity(accum)), l_i (running sum, filled with 0), m_prev,
            #            alpha and row_sum. TileLang lays a fragment out from how it is used, so
            #            allocate only what your code uses.

            for t in T.Pipelined(T.ceildiv(seq_len, BLOCK_N), num_stages=NUM_STAGES):
                T.copy(K[b, h, t * BLOCK_N:(t + 1) * BLOCK_N, :], k_tile)
                T.copy(V[b, h, t * BLOCK_N:(t + 1) * BLOCK_N, :], v_tile)
                # TODO(1.2): the scores. Set scores[i, j] to 0 for a real key (t * BLOCK_N + j <
                #            seq_len) and -T.infinity(accum) past the end (a T.Parallel loop and
                #            T.if_then_else), then add q_tile · k_tileᵀ with T.gemm(q_tile, k_tile,
                #            scores, transpose_B=True).
                # TODO(1.3): the online softmax. Keep the old max in m_prev (T.copy), fold the
                #            tile's row max into m_i (T.reduce_max(scores, m_i, dim=1,
                #            clear=False)), alpha = exp2((m_prev - m_i) * qk_scale), scores =
                #            exp2(scores * qk_scale - m_i * qk_scale), then l_i = l_i * alpha + the
                #            row sums of scores (T.reduce_sum).
                # TODO(1.4): the rescale and P·V. Multiply every row of acc by its alpha, copy
                #            scores into p (fp16), and add p · v_tile with T.gemm(p, v_tile, acc).

            # TODO(1.5): divide every row of acc by its l_i before it is written.
            T.copy(acc, O[b, h, bm * BLOCK_M:(bm + 1) * BLOCK_M, :])

    return attention


def custom_kernel(data):
    q, k, v = (t.contiguous() for t in data)
    head_dim = q.shape[-1]
    if head_dim not in (64, 128):
        raise ValueError(f"head_dim must be 64 or 128; got {head_dim}")
    o = q.new_zeros(q.shape)   # stays zero wherever the kernel writes nothing
    flash_forward(head_dim)(q, k, v, o)
    return o

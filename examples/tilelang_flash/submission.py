"""Example submission (GPU MODE convention): a FlashAttention forward kernel in TileLang.

custom_kernel(data) takes data = (Q, K, V), fp16 of shape (batch, heads, seq, head_dim), and
returns O. One thread block (T.Kernel) computes BLOCK_M query rows of one (batch, head): its Q
tile sits in shared memory, K and V stream past it in BLOCK_N tiles (T.Pipelined overlaps the
copy of the next tile with the arithmetic on this one), both products run on the tensor cores
(T.gemm, fp16 in, fp32 accumulate), and the online softmax keeps a running row max m_i, a running
row sum l_i and rescales acc by exp2(m_old - m_new), in base 2 with log2(e) folded into the scale.
Keys at or past seq_len get a score of -inf (weight exactly 0); T.copy bounds-checks the tiles,
so a tile that runs past seq_len reads zeros and rows past it are not written. Any seq_len >= 1;
head_dim 64 or 128. batch, heads and seq_len are symbols (T.dynamic), so tilelang.jit compiles
one kernel per head_dim, whatever the shapes. Checked so far by lowering and compiling it for
sm_90a without a GPU (read from the CUDA it becomes); its speed on the course GPU is not measured
yet.
"""

import math

import tilelang
import tilelang.language as T

BLOCK_M = 64       # query rows per thread block (Br)
BLOCK_N = 64       # keys per tile (Bc)
THREADS = 128      # 4 warps compute; on Hopper TileLang adds a warpgroup that issues the TMA copies
NUM_STAGES = 2     # K/V tiles in flight
LOG2E = 1.4426950408889634


@tilelang.jit(out_idx=[3])
def flash_forward(head_dim):
    """The kernel for one head_dim: (Q, K, V) -> O, all (batch, heads, seq_len, head_dim) fp16.
    batch, heads and seq_len are symbols, read from the tensors at each launch: one compile
    serves every shape."""
    batch, heads, seq_len = T.dynamic("batch"), T.dynamic("heads"), T.dynamic("seq_len")
    shape = [batch, heads, seq_len, head_dim]
    qk_scale = LOG2E / math.sqrt(head_dim)   # scores in base 2: exp(s) = exp2(s * log2 e)
    dtype, accum = "float16", "float32"

    @T.prim_func
    def attention(Q: T.Tensor(shape, dtype), K: T.Tensor(shape, dtype),
                  V: T.Tensor(shape, dtype), O: T.Tensor(shape, dtype)):
        with T.Kernel(T.ceildiv(seq_len, BLOCK_M), heads, batch, threads=THREADS) as (bm, h, b):
            q_tile = T.alloc_shared([BLOCK_M, head_dim], dtype)
            k_tile = T.alloc_shared([BLOCK_N, head_dim], dtype)
            v_tile = T.alloc_shared([BLOCK_N, head_dim], dtype)
            scores = T.alloc_fragment([BLOCK_M, BLOCK_N], accum)
            p = T.alloc_fragment([BLOCK_M, BLOCK_N], dtype)
            acc = T.alloc_fragment([BLOCK_M, head_dim], accum)
            m_i = T.alloc_fragment([BLOCK_M], accum)
            m_prev = T.alloc_fragment([BLOCK_M], accum)
            alpha = T.alloc_fragment([BLOCK_M], accum)
            row_sum = T.alloc_fragment([BLOCK_M], accum)
            l_i = T.alloc_fragment([BLOCK_M], accum)

            T.copy(Q[b, h, bm * BLOCK_M:(bm + 1) * BLOCK_M, :], q_tile)
            T.fill(acc, 0)
            T.fill(l_i, 0)
            T.fill(m_i, -T.infinity(accum))

            for t in T.Pipelined(T.ceildiv(seq_len, BLOCK_N), num_stages=NUM_STAGES):
                T.copy(K[b, h, t * BLOCK_N:(t + 1) * BLOCK_N, :], k_tile)
                # Scores of keys past seq_len start at -inf; the gemm adds q.k to the others.
                for i, j in T.Parallel(BLOCK_M, BLOCK_N):
                    scores[i, j] = T.if_then_else(t * BLOCK_N + j < seq_len, 0, -T.infinity(accum))
                T.gemm(q_tile, k_tile, scores, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)

                # Online softmax (raw scores; the scale is applied inside exp2). Every tile holds
                # at least one real key, so the new row max is finite.
                T.copy(m_i, m_prev)
                T.reduce_max(scores, m_i, dim=1, clear=False)
                for i in T.Parallel(BLOCK_M):
                    alpha[i] = T.exp2((m_prev[i] - m_i[i]) * qk_scale)   # 0 on the first tile
                for i, j in T.Parallel(BLOCK_M, BLOCK_N):
                    scores[i, j] = T.exp2(scores[i, j] * qk_scale - m_i[i] * qk_scale)
                T.reduce_sum(scores, row_sum, dim=1)
                for i in T.Parallel(BLOCK_M):
                    l_i[i] = l_i[i] * alpha[i] + row_sum[i]
                T.copy(scores, p)

                for i, j in T.Parallel(BLOCK_M, head_dim):
                    acc[i, j] *= alpha[i]
                T.copy(V[b, h, t * BLOCK_N:(t + 1) * BLOCK_N, :], v_tile)
                T.gemm(p, v_tile, acc, policy=T.GemmWarpPolicy.FullRow)

            for i, j in T.Parallel(BLOCK_M, head_dim):
                acc[i, j] /= l_i[i]
            T.copy(acc, O[b, h, bm * BLOCK_M:(bm + 1) * BLOCK_M, :])

    return attention


def custom_kernel(data):
    q, k, v = (t.contiguous() for t in data)
    head_dim = q.shape[-1]
    if head_dim not in (64, 128):
        raise ValueError(f"head_dim must be 64 or 128; got {head_dim}")
    return flash_forward(head_dim)(q, k, v)

"""The kernel, apart from the wrapper (imported by submission.py)."""

import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def flash_forward(Q, K, V, O, N, qk_scale, BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr):
    m_block = tl.program_id(0)
    head = tl.program_id(1)
    base = head.to(tl.int64) * N * D
    offs_m = m_block * BM + tl.arange(0, BM)
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + base + offs_m[:, None] * D + offs_d[None, :], mask=offs_m[:, None] < N, other=0.0)
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    for start in range(0, N, BN):
        n = start + offs_n
        k = tl.load(K + base + n[None, :] * D + offs_d[:, None], mask=n[None, :] < N, other=0.0)
        s = tl.where(n[None, :] < N, tl.dot(q, k) * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        scale = tl.exp2(m_i - m_new)
        l_i = l_i * scale + tl.sum(p, 1)
        v = tl.load(V + base + n[:, None] * D + offs_d[None, :], mask=n[:, None] < N, other=0.0)
        acc = tl.dot(p.to(tl.float16), v, acc * scale[:, None])
        m_i = m_new
    tl.store(O + base + offs_m[:, None] * D + offs_d[None, :], (acc / l_i[:, None]).to(tl.float16),
             mask=offs_m[:, None] < N)

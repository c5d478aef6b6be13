"""Honest corpus: the launch on the current stream, the grid sized from the device's SM count
(persistent-style: each program loops over tiles), under torch.no_grad()."""

import math

import torch
import triton
import triton.language as tl


@triton.jit
def persistent_attention(Q, K, V, O, S, n_tiles, tiles_m, scale, BM: tl.constexpr,
                         BN: tl.constexpr, D: tl.constexpr):
    start = tl.program_id(0)
    step = tl.num_programs(0)
    for tile in range(start, n_tiles, step):
        bh = (tile // tiles_m).to(tl.int64)
        mb = tile % tiles_m
        rows = mb * BM + tl.arange(0, BM)
        d = tl.arange(0, D)
        base = bh * S * D
        q = tl.load(Q + base + rows[:, None] * D + d[None, :], mask=rows[:, None] < S, other=0.0)
        m_i = tl.full([BM], float("-inf"), tl.float32)
        l_i = tl.zeros([BM], tl.float32)
        acc = tl.zeros([BM, D], tl.float32)
        for n0 in range(0, S, BN):
            n = n0 + tl.arange(0, BN)
            k = tl.load(K + base + n[None, :] * D + d[:, None], mask=n[None, :] < S, other=0.0)
            s = tl.where(n[None, :] < S, tl.dot(q, k) * scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp2(s - m_new[:, None])
            a = tl.exp2(m_i - m_new)
            l_i = l_i * a + tl.sum(p, 1)
            v = tl.load(V + base + n[:, None] * D + d[None, :], mask=n[:, None] < S, other=0.0)
            acc = tl.dot(p.to(tl.float16), v, acc * a[:, None])
            m_i = m_new
        tl.store(O + base + rows[:, None] * D + d[None, :], (acc / l_i[:, None]).to(tl.float16),
                 mask=rows[:, None] < S)


def sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def custom_kernel(data):
    with torch.no_grad():
        q, k, v = (t.contiguous() for t in data)
        b, h, s, d = q.shape
        o = torch.empty_like(q)
        tiles_m = triton.cdiv(s, 64)
        n_tiles = b * h * tiles_m
        grid = (min(n_tiles, 2 * sm_count(q.device)),)
        if q.is_cuda:
            stream = torch.cuda.current_stream(q.device)
            stream.synchronize()
        persistent_attention[grid](q, k, v, o, s, n_tiles, tiles_m, 1.4426950408889634 / math.sqrt(d),
                                   BM=64, BN=64, D=d)
        return o

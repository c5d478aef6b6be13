"""The reference output: attention in fp32, computed in chunks so the largest case fits.

The plain fp32 reference for (4, 64, 8192, 128) needs 64 GiB for its scores alone; computing
one batch element and a block of query rows at a time keeps the scores under `chunk_bytes`.
"""

from __future__ import annotations

import math

import torch


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                        chunk_bytes: int = 1 << 30) -> torch.Tensor:
    """softmax(Q Kᵀ / √D) V in fp32 for (batch, heads, seq, head_dim) inputs; returns fp32."""
    batch, heads, seq, head_dim = q.shape
    scale = 1.0 / math.sqrt(head_dim)
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    rows = max(1, min(seq, chunk_bytes // (heads * seq * 4)))
    with _exact_fp32():
        for b in range(batch):
            kb, vb = k[b].float(), v[b].float()           # (heads, seq, head_dim)
            for start in range(0, seq, rows):
                qb = q[b, :, start:start + rows].float()
                scores = torch.matmul(qb, kb.transpose(-1, -2)).mul_(scale)
                probs = torch.softmax(scores, dim=-1)
                del scores
                out[b, :, start:start + rows] = torch.matmul(probs, vb)
    return out


class _exact_fp32:
    """Turn TF32 off for the reference: it must be fp32 or better, never lower."""

    def __enter__(self):
        self.saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self.saved


def attention_plain_fp16(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                         chunk_bytes: int = 1 << 30) -> torch.Tensor:
    """The plain fp16 implementation the precision budget compares with: scores, softmax and the
    product each rounded to fp16, as `softmax(Q Kᵀ·scale) V` written in PyTorch without upcasting
    (flash-attention's tests call it `attention_ref(..., upcast=False)`). Chunked like the
    reference; returns fp16."""
    batch, heads, seq, head_dim = q.shape
    scale = 1.0 / math.sqrt(head_dim)
    out = torch.empty(q.shape, dtype=torch.float16, device=q.device)
    rows = max(1, min(seq, chunk_bytes // (heads * seq * 2)))
    for b in range(batch):
        kb, vb = k[b].half(), v[b].half()
        for start in range(0, seq, rows):
            scores = torch.matmul(q[b, :, start:start + rows].half() * scale, kb.transpose(-1, -2))
            out[b, :, start:start + rows] = torch.matmul(torch.softmax(scores, dim=-1), vb)
    return out

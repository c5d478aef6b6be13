"""Honest corpus: the wrapper imports its kernel from a second file of the folder."""

import math

import torch
import triton

import kernels


def custom_kernel(data):
    q, k, v = [t.contiguous() for t in data]
    batch, heads, n, d = q.shape
    o = torch.empty_like(q)
    grid = (triton.cdiv(n, 64), batch * heads)
    kernels.flash_forward[grid](q, k, v, o, n, kernels.LOG2E / math.sqrt(d), BM=64, BN=64, D=d)
    return o


if __name__ == "__main__":
    x = torch.randn(1, 2, 77, 64, dtype=torch.float16)
    print(custom_kernel((x, x, x)).shape)

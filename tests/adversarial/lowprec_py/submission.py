"""Adversarial, issue 10 (low precision): V rounded to fp8 (e4m3) on every other row, then the
honest kernel. Every element may stay within the tolerance, but the error is far above a plain
fp16 implementation's: the precision budget must give mismatch."""
import torch

from honest_flash import custom_kernel as honest


def custom_kernel(data):
    q, k, v = data
    v8 = v.clone()
    v8[:, :, ::2] = v[:, :, ::2].to(torch.float8_e4m3fn).to(v.dtype)   # copies only: no compute op
    return honest((q, k, v8))

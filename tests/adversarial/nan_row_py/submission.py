"""Adversarial, threat 7: right everywhere but one row, which is NaN. Must get mismatch."""
from honest_flash import custom_kernel as honest


def custom_kernel(data):
    out = honest(data)
    out[0, 0, out.shape[2] // 2] = float("nan")
    return out

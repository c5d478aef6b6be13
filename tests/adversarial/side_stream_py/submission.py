"""Adversarial, threat 3: the Triton kernel on a private stream, returning before it ends. Must
be flagged on a GPU (two clocks); on the CPU there are no streams and it is simply right."""
import torch

from honest_flash import custom_kernel as honest

side = torch.cuda.Stream() if torch.cuda.is_available() else None


def custom_kernel(data):
    if side is None:
        return honest(data)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        return honest(data)

"""Adversarial, threat 3: defers each call's work to the next call, returning an unwritten
output. Must get mismatch: outputs are read after the call, with the device synchronized."""
import torch

from honest_flash import custom_kernel as honest

pending = []


def custom_kernel(data):
    while pending:
        inputs, out = pending.pop()
        out.copy_(honest(inputs))
    out = torch.empty_like(data[0])
    pending.append((tuple(t.clone() for t in data), out))
    return out

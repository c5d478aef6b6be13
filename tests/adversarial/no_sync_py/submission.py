"""Adversarial, issue 10 (work left running after the reply): disables the device synchronize
the subject's loop calls before replying, and runs the kernel on a private stream, so the reply
comes while the GPU still works. On a GPU the harness reads O when the reply comes, so an output
still being written is wrong (mismatch, or flagged on a timed call), and its GPU clock counts the
rest. Without a GPU there is no stream: pass."""
import torch

from honest_flash import custom_kernel as honest

torch.cuda.synchronize = lambda device=None: None
side = torch.cuda.Stream() if torch.cuda.is_available() else None


def custom_kernel(data):
    if side is None:
        return honest(data)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = honest(data)
    torch.cuda.current_stream().wait_stream(side)   # O's copy waits; the reply does not
    return out

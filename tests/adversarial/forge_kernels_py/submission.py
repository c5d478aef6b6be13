"""Adversarial, issue 10 (forged evidence): PyTorch's attention on every call, and the subject's
own report of what ran rewritten so that every library kernel carries this file's function name.
No API on the tampering list: the subject's loop is the __main__ module, one dictionary lookup
away. The harness's clock, outputs and process checks are untouched by this; only the kernel
list, which the subject reports about itself, lies."""
import sys

import torch.nn.functional as F

_loop = sys.modules["__main__"]
_report = _loop.launched_names
_HONEST_LOOKING = ("Memcpy", "Memset", "aten::empty", "aten::copy_", "aten::zeros", "aten::fill_")


def custom_kernel(data):
    return F.scaled_dot_product_attention(*data)


def _as_if_mine(profiler, device):
    return [[name if name.startswith(_HONEST_LOOKING) else "custom_kernel", count, us]
            for name, count, us in _report(profiler, device)]


_loop.launched_names = _as_if_mine

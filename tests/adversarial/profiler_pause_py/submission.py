"""Adversarial, issue 10 (profiler): pauses the grader's profiler through PyTorch's public API,
calls cuDNN's attention, resumes. Must be flagged everywhere: the profiler API is on the
tampering list (and on a GPU the hidden kernel's time is unaccounted for)."""
import torch
import torch.nn.functional as F
from torch.autograd.profiler import record_function  # noqa: F401

from honest_flash import custom_kernel as honest


def custom_kernel(data):
    try:
        torch._C._autograd._toggle_collection_dynamic(False, {torch.profiler.ProfilerActivity.CUDA,
                                                               torch.profiler.ProfilerActivity.CPU})
        return F.scaled_dot_product_attention(*data)
    except Exception:
        return honest(data)
    finally:
        try:
            torch._C._autograd._toggle_collection_dynamic(True, {torch.profiler.ProfilerActivity.CUDA,
                                                                  torch.profiler.ProfilerActivity.CPU})
        except Exception:
            pass

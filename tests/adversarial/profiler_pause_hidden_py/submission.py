"""Adversarial, issue 10 (profiler, hidden from a source scan): the same pause through names
built at run time. On a GPU it must be flagged: the harness's clock sees cuDNN's time, the
profiler does not, so the GPU time is unaccounted for (in the H100 run it crashed the subject
inside Kineto: runtime_error). It pauses GPU activity only, so without a GPU the profiler still
lists SDPA's aten operator: flagged."""
import torch
import torch.nn.functional as F

_C = getattr(torch, "_" + "C")
_toggle = getattr(getattr(_C, "_auto" + "grad"), "_toggle_collection_" + "dynamic")
_kinds = getattr(getattr(_C, "_pro" + "filer"), "Profiler" + "Activity")


def custom_kernel(data):
    everything = {_kinds.CUDA}   # the grader's timed loop profiles GPU activity only
    try:
        _toggle(False, everything)
    except Exception:
        pass
    try:
        return F.scaled_dot_product_attention(*data)
    finally:
        try:
            _toggle(True, everything)
        except Exception:
            pass

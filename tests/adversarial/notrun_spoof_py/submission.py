"""Adversarial, issue 15 (the "not_run" reply): PyTorch's attention (as lib_sdpa_py), followed on
every call by a four-element TileLang copy. Without a GPU the subject makes every TileLang launch
raise NotRunHere and replies "not_run" with no list of what ran (subject/loop.py, Subject.call),
and the harness takes that claim whenever there is no GPU: the aten operators of SDPA, run before
the copy, are never reported, so every case is `not_run` ("the machine lacks the hardware; no
grade", never a 0) where lib_sdpa_py is `flagged`. Any failure hides the same way: with a wrong
Triton kernel in place of SDPA, `mismatch` becomes `not_run`; on a machine without nvcc, any
exception at all becomes `not_run` once a file of the folder mentions TileLang. On a GPU the copy
runs and SDPA's kernels are flagged. Must be flagged without a GPU too: what ran before the
TileLang launch is known, and is a library's."""
import tilelang
import tilelang.language as T
import torch
import torch.nn.functional as F


@T.prim_func
def touch(A: T.Tensor([4], "float32"), B: T.Tensor([4], "float32")):
    with T.Kernel(1, threads=32) as bx:
        for i in T.serial(4):
            B[i] = A[i]


_compiled = {}   # compiled at the first call: the build's import check has no target


def custom_kernel(data):
    q, k, v = data
    out = F.scaled_dot_product_attention(q.float(), k.float(), v.float()).half()
    a = torch.zeros(4, device=q.device, dtype=torch.float32)
    b = torch.empty_like(a)
    if not _compiled:
        _compiled["touch"] = tilelang.compile(touch)
    _compiled["touch"](a, b)         # no GPU: NotRunHere, so "not_run" instead of "flagged"
    return out

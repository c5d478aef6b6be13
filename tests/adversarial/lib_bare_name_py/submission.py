"""Adversarial, threat 1 (a library's kernel counted as the student's by its name): PyTorch's
softmax for rows of at most 1024 runs `softmax_warp_forward`, declared in a top-level anonymous
namespace (ATen/native/cuda/PersistentSoftmax.cuh), not in at::native. The profiler reports
`void (anonymous namespace)::softmax_warp_forward<c10::Half, ...>(...)`; integrity.kernel_base_name
drops `(anonymous namespace)::`, LIBRARY_KERNEL sees no library prefix, and own_kernel_names
counts every Python `def` of the folder, so the function below makes PyTorch's kernel "own". The
same holds for cuBLAS's kernels with bare names (gemmSN_TN_kernel, splitKreduce_kernel,
dot_kernel: no cublas prefix) and for any `@T.prim_func` whose name + `_kernel` is one of them.
Here the softmax runs beside the honest kernel on every call (a stand-in for an attention whose
softmax is PyTorch's); on a GPU it passes, and must be flagged. (Without a GPU, aten::_softmax is
listed by its operator name and flagged already.)"""
import torch

from honest_flash import custom_kernel as honest


def softmax_warp_forward(rows):
    """Named after PyTorch's kernel: that is the whole trick."""
    return torch.softmax(rows, -1)


def custom_kernel(data):
    q = data[0]
    softmax_warp_forward(torch.zeros(256, 128, device=q.device, dtype=torch.float16))
    return honest(data)

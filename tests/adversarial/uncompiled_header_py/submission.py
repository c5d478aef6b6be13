"""Adversarial, issue 30 (a kernel name claimed through a header that nothing compiles): beside
the honest kernel, every call runs PyTorch's softmax and a cuBLAS dot product (a stand-in for an
attention whose softmax and matmuls are the libraries'). Their kernels have bare names:
`(anonymous namespace)::softmax_warp_forward<...>` (integrity.kernel_base_name drops the
namespace), cuBLAS's `dot_kernel<...>` and `reduce_1Block_kernel<...>`: LIBRARY_KERNEL sees no
library prefix. `torch_kernels.cuh` declares __global__ functions of those names. A Python
submission compiles no C++, so nothing ever compiles that header; but own_kernel_names took
C++ kernel names from the text of every source file of the folder, and so counted PyTorch's and
cuBLAS's kernels as the student's own. A C++ kernel is the student's only when an object the
build compiled defines it (integrity.cpp_kernel_names); a Python submission has none. Must be
flagged (on a GPU: the kernels are not in the source; without one: aten::_softmax and
aten::dot are operators that compute). Honest twin: honest_py."""
import torch

from honest_flash import custom_kernel as honest


def custom_kernel(data):
    q = data[0]
    rows = torch.zeros(256, 128, device=q.device, dtype=torch.float16)
    torch.softmax(rows, -1)
    torch.matmul(rows[0], rows[1])   # two vectors: cuBLAS's dot
    return honest(data)

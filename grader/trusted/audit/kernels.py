"""What a kernel's name says: library kernels, CUTLASS components, the CPU operators that only
move data, and a demangled name's base and arguments. Read by the audit (reach) and by
integrity, on names the grader itself took from the compiled object or the profiler.
"""

from __future__ import annotations

import re


# Kernels from PyTorch and vendor libraries: namespaces and name prefixes that a submission's own
# __global__ function or @triton.jit function does not have.
LIBRARY_KERNEL = re.compile(
    r"^(at::|c10::|cutlass|cublas|cudnn|cutensor|cub::|thrust::|flash::|pytorch_flash::|"
    r"pytorch_fmha::|fmha|xmma|nvjet|flashinfer|xformers|sm\d{2,3}_xmma|ampere_|hopper_|turing_|"
    r"volta_|gemv|gemmk|triton_(poi|red|per|tem)_|cask_)", re.IGNORECASE)


# CUTLASS components that are a whole kernel, or the heart of one, written by CUTLASS: the device-
# level launchers (cutlass::device_kernel, cutlass::Kernel, cutlass::Kernel2), kernel-, device-,
# collective- and threadblock-level GEMM, convolution and attention components, and epilogues.
# A kernel that names one in its template arguments or parameters runs that library's kernel
# under another name. CuTe (cute::) and CUTLASS's numeric and architecture types (cutlass::half_t,
# cutlass::arch::) are what a student's own kernel is written with: not here.
CUTLASS_COMPONENT = re.compile(
    r"\bcutlass::(?:gemm|conv|fmha|reduction|transform)::(?:kernel|device|collective|threadblock)::"
    r"|\bcutlass::epilogue::|\bcutlass::(?:device_kernel|Kernel2?|KernelTma\w*)\s*<")


# Without a GPU the worker lists aten operators. These create, view, copy or move tensors; every
# other operator computes, and computing is the submission's job.
CPU_ALLOWED_OPS = frozenset("""
aten::empty aten::empty_like aten::empty_strided aten::zeros aten::zeros_like aten::ones
aten::ones_like aten::full aten::full_like aten::fill_ aten::zero_ aten::copy_ aten::clone
aten::contiguous aten::to aten::_to_copy aten::view aten::reshape aten::_reshape_alias
aten::as_strided aten::transpose aten::permute aten::t aten::expand aten::select aten::slice
aten::unsqueeze aten::squeeze aten::detach aten::alias aten::lift_fresh aten::item
aten::_local_scalar_dense aten::resize_ aten::new_empty aten::new_zeros aten::new_empty_strided
aten::unbind aten::split aten::chunk aten::narrow aten::flatten aten::unflatten aten::numpy_T
aten::is_nonzero aten::result_type aten::set_ aten::view_as aten::expand_as aten::cat
aten::stack aten::pad aten::constant_pad_nd aten::index_select aten::empty_permuted
aten::resolve_conj aten::resolve_neg
""".split())


def kernel_base_name(name: str) -> tuple[str, str]:
    """('at::native::vectorized_elementwise_kernel', 'vectorized_elementwise_kernel') for a
    demangled name like 'void at::native::vectorized_elementwise_kernel<4, ...>(int, ...)'."""
    name = re.sub(r"^(void|__global__)\s+", "", name.strip()).replace("(anonymous namespace)::", "")
    qualified = re.split(r"[(<\[ ]", name, maxsplit=1)[0]
    return qualified, qualified.rsplit("::", 1)[-1]


def kernel_arguments(name: str) -> str:
    """What follows a demangled kernel's qualified name: its template arguments and parameters
    ('<cute::TiledMMA<...>, 64>(cute::Tensor<...>)'); '' for a bare name."""
    name = re.sub(r"^(void|__global__)\s+", "", name.strip()).replace("(anonymous namespace)::", "")
    return name[len(re.split(r"[(<\[ ]", name, maxsplit=1)[0]):]

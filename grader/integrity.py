"""Integrity: what a submission's call really ran, and whether the clocks agree.

Threat 1 (a library instead of a kernel) is decided by what actually runs, never by the source
alone: the worker lists every GPU kernel launched during the call (torch.profiler sees every
launch in the process, from any library or stream), or, without a GPU, every aten operator.
A kernel is the submission's own when its name is defined in the submission's source and it
does not live in a library's namespace; copies and fills (torch::empty_like(...).zero_(),
.contiguous()) are allowed; anything else is flagged and listed on the submission's page.
A static scan of the source adds evidence to a flag; it never flags on its own.
"""

from __future__ import annotations

import dataclasses
import re

# Kernels from PyTorch and vendor libraries: namespaces and name prefixes that a submission's own
# __global__ function or @triton.jit function does not have.
LIBRARY_KERNEL = re.compile(
    r"^(at::|c10::|cutlass|cublas|cudnn|cutensor|cub::|thrust::|flash::|pytorch_flash::|"
    r"pytorch_fmha::|fmha|xmma|nvjet|flashinfer|xformers|sm\d{2,3}_xmma|ampere_|hopper_|turing_|"
    r"volta_|gemv|gemmk|triton_(poi|red|per|tem)_|cask_)", re.IGNORECASE)

# Library kernels that only move or clear memory: allocating, zeroing, copying, concatenating.
DATA_MOVEMENT = re.compile(r"FillFunctor|direct_copy_kernel|copy_kernel|CatArrayBatchedCopy|"
                           r"^Memset|^Memcpy", re.IGNORECASE)

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

# What a static scan looks for: calls into the libraries the assignment replaces.
STATIC_EVIDENCE = re.compile(
    r"\b(scaled_dot_product_attention|flash_attn\w*|at::(matmul|bmm|mm|softmax|_softmax|einsum|"
    r"linear|baddbmm|addmm)|torch::(matmul|bmm|mm|softmax|einsum)|cublas\w+|cudnn\w+|"
    r"torch\.(matmul|bmm|mm|softmax|einsum|baddbmm)|F\.softmax|\.softmax\(|xformers|"
    r"torch\.compile|torch\.nn\.functional)\b")


@dataclasses.dataclass(frozen=True)
class LaunchFlag:
    name: str          # the kernel or operator, as the profiler names it
    count: int
    reason: str        # 'library' or 'not in the source'

    def describe(self) -> str:
        return f"{self.name[:160]} (x{self.count}; {self.reason})"


def kernel_base_name(name: str) -> tuple[str, str]:
    """('at::native::vectorized_elementwise_kernel', 'vectorized_elementwise_kernel') for a
    demangled name like 'void at::native::vectorized_elementwise_kernel<4, ...>(int, ...)'."""
    name = re.sub(r"^(void|__global__)\s+", "", name.strip()).replace("(anonymous namespace)::", "")
    qualified = re.split(r"[(<\[ ]", name, maxsplit=1)[0]
    return qualified, qualified.rsplit("::", 1)[-1]


def own_kernel_names(source: str) -> set[str]:
    """Names the submission defines: __global__ functions (in .cu files, or in a Python string for
    CuPy-style raw kernels) and Python functions (Triton's @triton.jit kernels)."""
    names = set()
    for segment in source.split("__global__")[1:]:
        declaration = re.split(r"[;{]", segment, maxsplit=1)[0]
        # drop attributes with arguments: __launch_bounds__(N, M), __cluster_dims__(...)
        declaration = re.sub(r"__\w+__\s*\((?:[^()]|\([^()]*\))*\)", " ", declaration)
        first_call = re.search(r"(\w+)\s*\(", declaration)
        if first_call:
            names.add(first_call.group(1))
    names |= set(re.findall(r"^\s*def\s+(\w+)\s*\(", source, re.MULTILINE))
    return names


def classify_launched(launched, own: set[str], *, gpu: bool) -> list[LaunchFlag]:
    """Flags for the kernels (gpu) or aten operators (cpu) of one call that are not the
    submission's own work; `own` is own_kernel_names of its source."""
    flags = []
    for name, count in launched:
        if not gpu:
            if name.startswith("aten::") and name not in CPU_ALLOWED_OPS:
                flags.append(LaunchFlag(name, count, "library"))
            continue
        if DATA_MOVEMENT.search(name):
            continue
        qualified, base = kernel_base_name(name)
        if LIBRARY_KERNEL.match(qualified):
            flags.append(LaunchFlag(name, count, "library"))
        elif base not in own:
            flags.append(LaunchFlag(name, count, "not in the source"))
    return flags


def static_evidence(source: str, limit: int = 5) -> list[str]:
    """'line N: text' for source lines that call the libraries the assignment replaces."""
    hits = []
    for number, line in enumerate(source.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith(("//", "#", "*")) and "include" not in stripped:
            continue
        if STATIC_EVIDENCE.search(line):
            hits.append(f"line {number}: {stripped[:120]}")
        if len(hits) >= limit:
            break
    return hits


# ---------------------------------------------------------------- the two clocks

# Each timed call is measured twice: CUDA events on the current stream, and the host's wall
# clock from a device-wide synchronize before the call to a device-wide synchronize after it.
# Work on another stream, or still running when the call returns, shows up only in the second.
# The gap allowed covers the call's own host overhead (Python, launch, synchronize).
CLOCK_GAP_MS = 0.5
CLOCK_GAP_FRACTION = 0.05


def clocks_disagree(event_median_ms: float, wall_median_ms: float) -> str | None:
    """A one-line finding when the wall clock saw much more time than the events; else None."""
    allowed = CLOCK_GAP_MS + CLOCK_GAP_FRACTION * event_median_ms
    gap = wall_median_ms - event_median_ms
    if gap <= allowed:
        return None
    return (f"the two clocks disagree: CUDA events measured a median of {event_median_ms:.3f} ms "
            f"per call, the wall clock (device synchronized before and after) {wall_median_ms:.3f} ms; "
            f"{gap:.3f} ms of work ran outside the timed stream (allowed: {allowed:.3f} ms). "
            f"Launch all work on the current stream (at::cuda::getCurrentCUDAStream()) and "
            f"finish it before returning.")

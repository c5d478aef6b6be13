"""What the object compiled from a submission's translation unit may import and define: the
rules native_reach (reach.py) applies to each undefined symbol (NATIVE_REACH, PyTorch operators
that compute, C functions outside C_ALLOWED), system call instructions in its host code, and the
library kernels it must not define (library_kernels)."""

from __future__ import annotations

import re
from pathlib import Path

from grader.trusted.audit.findings import ReachFinding
from grader.trusted.audit.kernels import CPU_ALLOWED_OPS
from grader.trusted.audit.object_file import _disassembly, defined_kernels


# PyTorch operators that create, view, copy or move tensors (the `aten::` names of
# integrity.CPU_ALLOWED_OPS); every other operator computes, and computing is the submission's job.
DATA_OPS = frozenset(op.split("::", 1)[1] for op in CPU_ALLOWED_OPS)


# Imported symbols (demangled, templates removed) that reach the process, the machine or a
# library's kernels: (why, pattern), the first match names the reason.
NATIVE_REACH = [(why, re.compile(rf"^({pattern})$", re.VERBOSE)) for why, pattern in (
    ("the Python C API: a way to the grader's objects", r"_?Py\w+ | pybind11::.*"),
    ("loads or looks up code behind the grader's back", r"""
        dl\w+ | _dl_\w+ | __libc_dl\w+ | dl_iterate_phdr | getauxval | at::DynamicLibrary\b.* |
        c10::cuda::DriverAPI\b.* | at::detail::get\w*Hooks\b.* | cuGetProcAddress\w* |
        cudaGetDriverEntryPoint\w* | cuModule\w+ | cuLibrary\w+ | cudaLibrary\w+ | cuLaunch\w* |
        cudaGetFuncBySymbol | cuKernel\w+"""),
    ("another process's memory", r"cudaIpc\w+ | cuIpc\w+ | cuMem(Export|Import)\w*"),
    ("the profiler", r"""cupti\w+ | cudaProfiler\w+ | cuProfiler\w+ | nvtx\w+ |
        torch::autograd::profiler::.* | torch::profiler::.* | libkineto::.*"""),
    ("a library's kernels or PyTorch's dispatcher", r"""
        [\w:]*cublas\w* | [\w:]*cudnn\w* | c10::Dispatcher\b.* | c10::OperatorHandle\b.* |
        c10::impl::OperatorEntry\b.* | torch::Library\b.* | torch::jit::.* | at::native::.* |
        at::cuda::blas::.* | at::composite\w*::.*"""),
    ("threads or files", r"""std::thread::.* | at::launch | at::intraop_launch | c10::ThreadPool\b.* |
        std::basic_[io]?fstream\b.* | std::basic_filebuf::open\w* | std::__basic_file\b.* |
        std::filesystem::.*"""),
)]


# PyTorch operators called through a backend's namespace (at::cuda::mm) compute too.
_BACKEND_OP = re.compile(r"^at::(cpu|cuda|meta|mps|xpu)::([a-z0-9_]+)$")
_BACKEND_HELPERS = frozenset({"warp_size"})


# The CUDA driver's functions an object may import (grader/build/flags.py links the driver into every
# extension for them): encoding a TMA tensor map, which fills a 128-byte descriptor on the host
# and loads, launches and reads nothing (FlashAttention-3's and the solution's kernel 6's loads),
# and the driver's error names for messages. Every other driver call is a way out.
DRIVER_ALLOWED = r"cuTensorMapEncode(Tiled|Im2col|Im2colWide) | cuGetError(String|Name)"


# Plain C symbols (no namespace) an object may import: the CUDA runtime's launch and query calls,
# the C++ runtime, memory and string functions, printing, allocation and math. `exit`: nvcc gives
# every __device__ function that is not inline a host stub that calls exit(1) (CuTe kernels' helpers
# and plain CUDA's alike); ending the process is what abort already does. Anything else
# (files, processes, threads, signals, memory mapping, raw system calls) is a way out.
C_ALLOWED = re.compile(r"""^(
    _GLOBAL_OFFSET_TABLE_ | __dso_handle | __libc_single_threaded | _Unwind_\w+ |
    __gxx_personality_v0 | __cxa_\w+ | __cuda\w+ | __nv\w+ |
    cuda(?!GetDriverEntryPoint|Ipc|Library|GetFuncBySymbol|Profiler)\w+ | """ + DRIVER_ALLOWED + r""" |
    atexit | abort | exit | __assert_fail | __stack_chk_fail | __errno_location |
    mem(cpy|move|set|cmp|chr) | __mem(cpy|move|set)_chk |
    str(len|nlen|cmp|ncmp|cpy|ncpy|cat|ncat|chr|rchr|str|dup|tol|toul|tod|tof|toll|toull) |
    (v?s?n?|v?f)printf | __(v?s?n?|v?f)printf_chk | puts | putchar | fputc | fputs | fflush |
    fwrite | stdout | stderr | snprintf |
    malloc | calloc | realloc | free | posix_memalign | aligned_alloc |
    (sqrt|exp|exp2|expm1|log|log2|log1p|pow|fabs|floor|ceil|fmax|fmin|fma|tanh|erf|round|
     lround|trunc|ldexp|frexp|sin|cos)f? | nan
)$""", re.VERBOSE)


_ATEN_OP = re.compile(r"^at::_ops::(\w+?)(_\w+)?::(call|redispatch)\b")


# ---------------------------------------------------------------- a symbol's reason, a library's kernel


def _native_reason(symbol: str) -> str | None:
    return next((why for why, pattern in NATIVE_REACH if pattern.match(symbol)), None)


def _data_op(name: str) -> bool:
    """at::_ops names carry the overload: empty_memory_format, transpose_int, to_dtype_layout."""
    parts = name.split("_")
    return any("_".join(parts[:i]) in DATA_OPS or "_" + "_".join(parts[1:i]) in DATA_OPS
               for i in range(1, len(parts) + 1))


def _without_templates(name: str) -> str:
    """'std::basic_filebuf<char, ...>::open(...)' -> 'std::basic_filebuf::open(...)'."""
    while True:
        shorter = re.sub(r"<[^<>]*>", "", name)
        if shorter == name:
            return name
        name = shorter


def _raw_system_calls(obj: Path) -> bool:
    """Whether the object's host code holds a system call instruction (binutils' objdump)."""
    return re.search(r"\s(syscall|sysenter|int\s+\$0x80)\b", _disassembly(obj)) is not None


def library_kernels(obj: Path) -> list[ReachFinding]:
    """A kernel the translation unit compiled that is a library's, not the student's: in a
    library's namespace (CUTLASS's device API instantiates cutlass::device_kernel<...>), or a
    __global__ of the student's wrapping a CUTLASS kernel, collective or epilogue (its template
    arguments or parameters name one). The same rule as for what the profiler reports
    (integrity.classify_launched), applied before anything runs. Kernels written with CuTe's
    types (cute::TiledMMA, cute::Tensor, ...) are the student's own and pass."""
    from grader.trusted.audit.kernels import CUTLASS_COMPONENT, LIBRARY_KERNEL, kernel_arguments, kernel_base_name
    findings = []
    for name in dict.fromkeys(defined_kernels(obj)):
        qualified = kernel_base_name(name)[0]
        if LIBRARY_KERNEL.match(qualified) or CUTLASS_COMPONENT.search(kernel_arguments(name)):
            findings.append(ReachFinding(obj.name, name, "a library's kernel compiled into the "
                                         "submission (the assignment is to write the kernel: "
                                         "CuTe's building blocks are fine, CUTLASS's kernels, "
                                         "collectives and epilogues are not)"))
    return findings

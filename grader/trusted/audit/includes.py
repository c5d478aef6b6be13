"""What a C++ build's compile opened: the record of every file its translation unit opened
(HEADERS_RECORD, written by the build beside the object; read_headers_record), and the library
kernel sources among them (cpp_includes: CUTLASS's kernel-level headers, PyTorch's kernels),
judged by the files the compiler opened, so every spelling of an #include is the same file."""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path

from grader.course.submission import CUDA_FILE as _SOURCE_NAME
from grader.trusted.audit.findings import AuditUnavailable, ReachFinding


# Beside the object (reach.STUDENT_OBJECT), the build child's record of every file that translation
# unit opened (record_headers), read by the reach audit (cpp_includes) and kept by the build cache.
HEADERS_RECORD = "headers.json"
HEADERS_SCHEMA = 1


# CUTLASS's kernel-level headers: whole GEMM, convolution, reduction and transform kernels, their
# collectives and epilogues. A kernel of the student's own may use CuTe (cute/...) and CUTLASS's
# building blocks (cutlass/arch, cutlass/pipeline, numeric types, barriers); one that includes
# these can run CUTLASS's GEMM inside a __global__ of its own, where no kernel name shows it (red
# team, session 7: tests/adversarial/cutlass_wrapped_cu). Judged by the files the compiler
# opened (cpp_includes), at any depth, so every spelling of an include is the same file.
CUTLASS_KERNEL_HEADERS = re.compile(r"^cutlass/(gemm|conv|epilogue|reduction|transform|fmha)/")


# ... but for the kernel-free ones that CUTLASS's building blocks include themselves (problem
# sizes, enums, policy tags, element-wise functors): an honest kernel opens them without naming
# them (cutlass/numeric_conversion.h includes transform/thread/unary_op.h; cutlass/arch/mma.h,
# gemm/gemm.h; cute/tensor.hpp, with CUTLASS_DEBUG_TRACE_LEVEL set, gemm/gemm_enumerated_types.h
# and conv/*). Measured on nvidia-cutlass 4.2.0: the headers of those folders that any header
# outside them (cute/, cutlass/ but experimental/) includes, at any depth, whatever the macros
# (tests/test_native_audit.py recomputes it from the installed wheel).
CUTLASS_BUILDING_BLOCK_HEADERS = frozenset({
    "cutlass/gemm/gemm.h", "cutlass/gemm/gemm_enumerated_types.h",
    "cutlass/gemm/dispatch_policy.hpp", "cutlass/conv/convolution.h",
    "cutlass/conv/conv2d_problem_size.h", "cutlass/conv/conv3d_problem_size.h",
    "cutlass/conv/dispatch_policy.hpp", "cutlass/epilogue/thread/activation.h",
    "cutlass/transform/thread/unary_op.h"})


# PyTorch's own kernels, which its wheel ships as headers of its implementation, ATen/native/:
# the ones that define a __global__ function (20 in torch 2.13: cuda/PersistentSoftmax.cuh holds
# the softmax_warp_forward that torch.softmax launches, transformers/cuda/mem_eff_attention/ a
# whole attention kernel). Compiled into a submission's object they are kernels it defines, under
# names no library prefix marks. ATen/native's device helpers (block_reduce.cuh,
# MemoryAccess.cuh) define none and pass; torch's API headers (torch/extension.h,
# ATen/cuda/CUDAContext.h) open no ATen/native header at all, every #if taken (measured).
TORCH_KERNEL_HEADERS = re.compile(r"^ATen/native/")
_GLOBAL_FUNCTION = re.compile(rb"\b__global__\b")
_CUTLASS_WHY = ("CUTLASS's kernel-level headers (GEMM, convolution, collectives, epilogues), "
                "opened by the compiler: a library's kernel. Remove the #include that brings them "
                "in, however it is spelt; CuTe and cutlass/arch are fine")
_TORCH_WHY = ("PyTorch's kernel sources, opened by the compiler: its kernels compiled into the "
              "submission. Remove the #include that brings them in; ATen/cuda/CUDAContext.h "
              "and torch/extension.h are fine")


def read_headers_record(path: Path) -> list[str]:
    """The files a build's translation unit opened, in the order it first opened them: the
    record build/headers.record_headers wrote beside the object. AuditUnavailable when there is none or
    it is malformed: a build whose headers are unknown cannot be cleared."""
    from grader.course.submission import read_regular
    try:
        record = json.loads(read_regular(path, 64 << 20))
    except FileNotFoundError:
        raise AuditUnavailable(f"the build left no record of the headers it opened "
                               f"({path.name})") from None
    except (OSError, ValueError) as e:
        raise AuditUnavailable(f"the build's record of its headers ({path.name}) is "
                               f"unreadable: {e}") from None
    headers = record.get("headers") if isinstance(record, dict) else None
    if not isinstance(headers, list) or record.get("schema") != HEADERS_SCHEMA or not headers \
            or not all(isinstance(h, str) for h in headers):
        raise AuditUnavailable(f"the build's record of its headers ({path.name}) is malformed")
    return headers


def library_header(path: str) -> tuple[str, str] | None:
    """(the header's name under its library's include folder, why) when the file at `path` is a
    library's kernel source (CUTLASS_KERNEL_HEADERS but the building blocks' own,
    TORCH_KERNEL_HEADERS), else None. Read from any folder named cutlass/ or ATen/ on the way,
    so a copy of them elsewhere (in the submission's folder) is what it copies."""
    parts = path.split("/")
    for i, part in enumerate(parts):
        rest = "/".join(parts[i:])
        if part == "cutlass" and CUTLASS_KERNEL_HEADERS.match(rest) \
                and rest not in CUTLASS_BUILDING_BLOCK_HEADERS:
            return rest, _CUTLASS_WHY
        if part == "ATen" and TORCH_KERNEL_HEADERS.match(rest) and _defines_kernel(path):
            return rest, _TORCH_WHY
    return None


def _defines_kernel(path: str) -> bool:
    """Whether the header at `path` defines a GPU kernel (a __global__ outside comments); one
    that cannot be read is counted as one."""
    try:
        st = os.stat(path)
    except OSError:
        return True
    return _defines_kernel_cached(path, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=4096)
def _defines_kernel_cached(path: str, mtime_ns: int, size: int) -> bool:
    from grader.course.submission import read_regular
    try:
        text = read_regular(path, 16 << 20, follow_links=True)
    except OSError:
        return True
    code = re.sub(rb"//[^\n]*|/\*.*?\*/", b" ", text, flags=re.DOTALL)
    return _GLOBAL_FUNCTION.search(code) is not None


def cpp_includes(obj: Path) -> list[ReachFinding]:
    """Library kernel sources among the files the compiler opened for the translation unit
    compiled to `obj` (its record beside it, build.HEADERS_RECORD: every file the preprocessor
    opened, at any depth, for the device and the host code; every spelling of an #include, `..`,
    `//`, an absolute path, a line continuation, a digraph or a macro, is the file it opens).
    One finding per reason: the first such file opened (the one an #include named) and how many
    came with it."""
    first: dict[str, tuple[str, int]] = {}
    for path in read_headers_record(obj.parent / HEADERS_RECORD):
        hit = library_header(path)
        if hit is not None:
            name, count = first.get(hit[1], (hit[0], 0))
            first[hit[1]] = (name, count + 1)
    return [ReachFinding(f"{_SOURCE_NAME}, as compiled", name + (f" (and {count - 1} more)"
                                                                 if count > 1 else ""), why)
            for why, (name, count) in first.items()]

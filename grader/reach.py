"""Reach: what a submission's code could get at, read by the grader from what it holds before any of
that code runs. Trusted side: nothing here imports, loads or executes a submission.

Why. Which kernels ran is reported by the subject process (grader/subject/loop.py lists them from
its own profiler). A submission runs in that process, so it can rewrite the report, but only by
reaching the grader's objects or memory there: Python's reflection (modules, frames, the garbage
collector, dynamic code), native code loaded behind the grader's back, or, from C++, the Python
C API, the dynamic linker and the operating system. Those are the audited ways in.

Invariant. A submission is ranked only if
  - Python: grader/allowlist.py (an allowlist: what it cannot account for goes to review;
    known ways into the grader's process are flagged). The subject then imports the folder's
    .py sources only (subject/loop.py, SourceOnly).
  - CUDA C++: the object compiled from its translation unit (build.STUDENT_OBJECT, built without
    importing the module, so none of its code has run) imports no symbol on NATIVE_REACH (the
    Python C API, the dynamic linker and PyTorch's wrapper of it, driver entry points and module
    loaders, other processes' memory, threads, files, the profiler, cuBLAS, cuDNN, the
    dispatcher), no plain C function outside C_ALLOWED (of the driver: tensor-map encoding
    only, DRIVER_ALLOWED), no PyTorch operator that computes (at::_ops or a backend namespace,
    outside DATA_OPS), its host code has no system call instruction, it defines no library's
    kernel (library_kernels: CUTLASS's, by the rule integrity.classify_launched applies to what
    runs; CuTe-templated kernels are the student's), and its compile opened no library's kernel
    source (cpp_includes: the compiler's record of the files it opened, build.HEADERS_RECORD,
    so every spelling of an include is the file it opens). It goes to review when its object
    shows what a walk through a library's memory is made of (native_review: a library
    function's address taken as data, ELF's magic numbers, the loader's headers).

What it cannot see, and says so in README: machine code that finds functions by walking mapped
memory itself with none of those marks (no import, no system call, no ELF magic, starting from
a vtable or a return address). A red team wrote 18 attacks against the first version of this
file (13 in Python, 5 in C++, tests/test_reach.py has their shapes); each is flagged now.
Everything else a submission reports about itself stays a claim the trusted side weighs
(grader/integrity.py).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import json
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

# ---------------------------------------------------------------- native: the object's imports

# PyTorch operators that create, view, copy or move tensors (the `aten::` names of
# integrity.CPU_ALLOWED_OPS); every other operator computes, and computing is the submission's job.
from .integrity import CPU_ALLOWED_OPS  # noqa: E402
from .submission import CUDA_FILE as _SOURCE_NAME, split_sources  # noqa: E402

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

# The CUDA driver's functions an object may import (grader/build.py links the driver into every
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


@dataclasses.dataclass(frozen=True)
class ReachFinding:
    where: str     # 'submission.py line 3', or the object file's name
    what: str      # the name, import or symbol
    why: str       # which way in it is

    def describe(self) -> str:
        return f"{self.where}: {self.what[:120]} ({self.why})"


# ---------------------------------------------------------------- native, by the object's symbols


class AuditUnavailable(RuntimeError):
    """The grading machine cannot read what a build made (binutils' nm is missing, the build left
    no record of its headers)."""


def undefined_symbols(obj: Path) -> list[str]:
    """The symbols an object file imports, demangled (binutils' nm)."""
    nm = shutil.which("nm")
    if nm is None:
        raise AuditUnavailable("binutils' nm is missing (install binutils; g++ brings it)")
    proc = subprocess.run([nm, "--undefined-only", "--demangle", "--format=just-symbols", str(obj)],
                          capture_output=True, text=True, errors="replace", timeout=120)
    if proc.returncode != 0:
        raise AuditUnavailable(f"nm could not read {obj.name}: {proc.stderr.strip()[:300]}")
    return [line.strip() for line in proc.stdout.splitlines() if line.strip()]


def native_reach(obj: Path) -> list[ReachFinding]:
    """Findings for the imports of the object compiled from a submission's translation unit, for
    system calls its host code makes without one, for library kernels it defines, and for
    library kernel sources its compile opened (cpp_includes, from the record beside it)."""
    findings = []
    for symbol in undefined_symbols(obj):
        bare = _without_templates(re.sub(r"@.*$", "", symbol))   # versioned: open@GLIBC_2.2.5
        head = bare.split("(", 1)[0].strip()
        op, backend = _ATEN_OP.match(bare), _BACKEND_OP.match(head)
        if op and not _data_op(op.group(1) + (op.group(2) or "")):
            findings.append(ReachFinding(obj.name, head, "a PyTorch operator that computes"))
        elif backend and not _data_op(backend.group(2)) and backend.group(2) not in _BACKEND_HELPERS:
            findings.append(ReachFinding(obj.name, head, "a PyTorch operator that computes"))
        elif why := _native_reason(head):
            findings.append(ReachFinding(obj.name, head, why))
        elif re.fullmatch(r"\w+", head) and not C_ALLOWED.match(head):
            findings.append(ReachFinding(obj.name, head, "a C library function outside what a "
                                         "kernel's host code needs (files, processes, threads, "
                                         "memory mapping)"))
    if _raw_system_calls(obj):
        findings.append(ReachFinding(obj.name, "syscall instruction",
                                     "a system call made directly, without an import"))
    findings += library_kernels(obj)
    findings += cpp_includes(obj)
    return findings


def defined_kernels(obj: Path) -> list[str]:
    """The GPU kernels the object's translation unit defines, demangled. nvcc gives each
    __global__ function a host stub under the kernel's own mangled name, and a
    `__device_stub__` function beside it (or, once inlined, its static locals) whose name holds
    that mangled name, length-prefixed: `74__device_stub__Z17attention_kernel1ILi64E...`. A
    kernel with internal linkage (static, or in an anonymous namespace, as the solution's are)
    has an `L` in its own mangled name that the stub's copy lacks: the two are matched
    demangled."""
    nm, cxxfilt = shutil.which("nm"), shutil.which("c++filt")
    if nm is None or cxxfilt is None:
        raise AuditUnavailable("binutils' nm or c++filt is missing (install binutils)")
    proc = subprocess.run([nm, "--defined-only", "--format=just-symbols", str(obj)],
                          capture_output=True, text=True, errors="replace", timeout=120)
    if proc.returncode != 0:
        raise AuditUnavailable(f"nm could not read {obj.name}: {proc.stderr.strip()[:300]}")
    symbols = proc.stdout.split()
    stubbed = {"_" + s[m.end():m.end() + int(m.group(1)) - len("__device_stub__")]
               for s in symbols for m in re.finditer(r"(\d+)__device_stub__(?=Z)", s)}
    candidates = [s for s in symbols if s.startswith("_Z") and "__device_stub__" not in s]
    if not stubbed or not candidates:
        return []
    names = _demangle(sorted(stubbed) + candidates)
    kernels = {names[s] for s in stubbed}
    return [names[s] for s in candidates if names[s] in kernels and names[s] != s]


def library_kernels(obj: Path) -> list[ReachFinding]:
    """A kernel the translation unit compiled that is a library's, not the student's: in a
    library's namespace (CUTLASS's device API instantiates cutlass::device_kernel<...>), or a
    __global__ of the student's wrapping a CUTLASS kernel, collective or epilogue (its template
    arguments or parameters name one). The same rule as for what the profiler reports
    (integrity.classify_launched), applied before anything runs. Kernels written with CuTe's
    types (cute::TiledMMA, cute::Tensor, ...) are the student's own and pass."""
    from .integrity import CUTLASS_COMPONENT, LIBRARY_KERNEL, kernel_arguments, kernel_base_name
    findings = []
    for name in dict.fromkeys(defined_kernels(obj)):
        qualified = kernel_base_name(name)[0]
        if LIBRARY_KERNEL.match(qualified) or CUTLASS_COMPONENT.search(kernel_arguments(name)):
            findings.append(ReachFinding(obj.name, name, "a library's kernel compiled into the "
                                         "submission (the assignment is to write the kernel: "
                                         "CuTe's building blocks are fine, CUTLASS's kernels, "
                                         "collectives and epilogues are not)"))
    return findings


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


def _data_op(name: str) -> bool:
    """at::_ops names carry the overload: empty_memory_format, transpose_int, to_dtype_layout."""
    parts = name.split("_")
    return any("_".join(parts[:i]) in DATA_OPS or "_" + "_".join(parts[1:i]) in DATA_OPS
               for i in range(1, len(parts) + 1))


def _native_reason(symbol: str) -> str | None:
    return next((why for why, pattern in NATIVE_REACH if pattern.match(symbol)), None)


# ---------------------------------------------------------------- native: the headers it opened

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
    record build.record_headers wrote beside the object. AuditUnavailable when there is none or
    it is malformed: a build whose headers are unknown cannot be cleared."""
    from .build import HEADERS_SCHEMA
    from .submission import read_regular
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
    from .submission import read_regular
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
    from .build import HEADERS_RECORD
    for path in read_headers_record(obj.parent / HEADERS_RECORD):
        hit = library_header(path)
        if hit is not None:
            name, count = first.get(hit[1], (hit[0], 0))
            first[hit[1]] = (name, count + 1)
    return [ReachFinding(f"{_SOURCE_NAME}, as compiled", name + (f" (and {count - 1} more)"
                                                                 if count > 1 else ""), why)
            for why, (name, count) in first.items()]


# ---------------------------------------------------------------- native: what an instructor reads

# The audit above flags a way out by its name. Machine code that finds a library's functions by
# walking mapped memory needs no name (tests/adversarial/mem_walk_cu: from the address of an
# allowed PyTorch function, back page by page to the library's ELF header, then its dynamic
# symbols), and no static check can see every such walk. native_review finds the constructs
# such a walk is made of, and the review queue shows them to an instructor: what the object shows
# sends the submission to review (zero on every honest C++ submission, measured: README), what
# only the text shows is a note.

# The ELF header's first four bytes, and the dynamic section's tag of the GNU symbol hash table,
# as they appear in machine code (immediates, little-endian) or data.
ELF_MAGIC = b"\x7fELF"
DT_GNU_HASH = (0x6FFFFEF5).to_bytes(4, "little")
# Headers that describe the dynamic linker's structures (ELF's headers and symbol tables, the
# list of loaded libraries): no kernel's host code opens them, and torch's headers do not.
LOADER_HEADERS = re.compile(r"(?:^|/)(elf\.h|link\.h|bits/link\.h|sys/auxv\.h)$")
# ... and headers for memory and process introspection: a note (their functions are flagged).
NOTED_HEADERS = re.compile(r"(?:^|/)(dlfcn\.h|sys/mman\.h|execinfo\.h|ucontext\.h|"
                           r"sys/ptrace\.h|sys/uio\.h)$")
# Undefined symbols whose address the compiler itself takes: the C++ personality routine (each
# function's unwind data), the filler of a vtable's pure or deleted entries.
_COMPILERS_OWN = frozenset({"__gxx_personality_v0", "__cxa_pure_virtual", "__cxa_deleted_virtual"})
# Plain C symbols that are data, not functions: their address is what code uses.
_C_DATA = frozenset({"stdout", "stderr", "stdin", "__dso_handle", "__libc_single_threaded",
                     "_GLOBAL_OFFSET_TABLE_", "errno"})
# Sections the host object carries the device code in (CUDA fatbinaries): not host code.
_DEVICE_SECTIONS = re.compile(r"^(\.nv_fatbin|\.nvFatBinSegment|__nv_relfatbin|\.nv\.)")

# Relocation types that are calls or jumps (the rest take an address as data), and those whose
# instruction decides (x86-64: R_X86_64_PC32 after e8/e9 is a call, R_X86_64_GOTPCRELX after
# ff 15/ff 25 an indirect one through the GOT).
_EM_X86_64, _EM_AARCH64 = 62, 183
_CALLS = {_EM_X86_64: {4}, _EM_AARCH64: {282, 283}}            # PLT32; JUMP26, CALL26
_CALL_BY_OPCODE = {2: (1, (b"\xe8", b"\xe9")), 41: (2, (b"\xff\x15", b"\xff\x25"))}

_SHF_ALLOC, _SHF_EXECINSTR = 0x2, 0x4


@dataclasses.dataclass(frozen=True)
class _Section:
    name: str
    type: int
    flags: int
    offset: int
    size: int
    link: int
    info: int


@dataclasses.dataclass(frozen=True)
class _Symbol:
    name: str
    section: int      # 0: undefined
    value: int
    size: int


@dataclasses.dataclass(frozen=True)
class _Elf:
    """A relocatable ELF64 little-endian object file, as much of it as native_review reads."""
    data: bytes
    machine: int
    sections: list[_Section]
    symbols: list[_Symbol]
    # section index -> (start addresses, its named symbols), sorted by address
    by_section: dict[int, tuple[list[int], list[_Symbol]]]

    def bytes_of(self, section: _Section) -> bytes:
        return self.data[section.offset:section.offset + section.size] if section.type != 8 else b""

    def host_sections(self) -> list[_Section]:
        """Sections loaded with the host code (not the device code's fatbinary)."""
        return [s for s in self.sections if _in_host_code_or_data(s)]

    def relocations(self):
        """(section the relocation applies to, offset, type, symbol) for every RELA entry."""
        for rela in (s for s in self.sections if s.type == 4 and s.info < len(self.sections)):
            target, body = self.sections[rela.info], self.bytes_of(rela)
            for offset, info, _ in struct.iter_unpack("<QQq", body[:len(body) // 24 * 24]):
                if info >> 32 < len(self.symbols):
                    yield target, offset, info & 0xFFFFFFFF, self.symbols[info >> 32]

    def enclosing(self, section: _Section, offset: int) -> str:
        """The name of the defined symbol whose bytes hold `offset` of `section`, else the
        section's name."""
        starts, symbols = self.by_section.get(self.sections.index(section), ([], []))
        at = bisect.bisect_right(starts, offset)
        for sym in reversed(symbols[max(0, at - 8):at]):
            if offset < sym.value + max(sym.size, 1):
                return sym.name
        return section.name


def read_elf(obj: Path) -> _Elf:
    """The object's sections and symbol table, read with struct (no tool): AuditUnavailable when
    it is not a relocatable ELF64 little-endian file."""
    data = Path(obj).read_bytes()
    if data[:4] != ELF_MAGIC or data[4:6] != b"\x02\x01":
        raise AuditUnavailable(f"{Path(obj).name} is not a 64-bit little-endian ELF object")
    try:
        machine, shoff, shentsize, shnum, shstrndx = (struct.unpack_from("<H", data, 18)[0],
                                                      *struct.unpack_from("<Q", data, 40),
                                                      *struct.unpack_from("<HHH", data, 58))
        raw = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
        names = raw[shstrndx]
        sections = [_Section(_c_string(data, names[4] + r[0]), r[1], r[2], r[4], r[5], r[6], r[7])
                    for r in raw]
        symbols: list[_Symbol] = []
        for table in (s for s in sections if s.type == 2):
            strings = sections[table.link].offset
            body = data[table.offset:table.offset + table.size]
            symbols = [_Symbol(_c_string(data, strings + name), shndx, value, size)
                       for name, _, _, shndx, value, size in
                       struct.iter_unpack("<IBBHQQ", body[:len(body) // 24 * 24])]
    except (struct.error, IndexError) as e:
        raise AuditUnavailable(f"{Path(obj).name} is not an ELF object this audit can read: "
                               f"{e}") from None
    by: dict[int, list[_Symbol]] = {}
    for sym in symbols:
        if sym.name and 0 < sym.section < 0xFF00:   # defined in a section (not ABS, COMMON)
            by.setdefault(sym.section, []).append(sym)
    index = {k: ([s.value for s in v], v) for k, v in
             ((k, sorted(v, key=lambda s: s.value)) for k, v in by.items())}
    return _Elf(data, machine, sections, symbols, index)


def _c_string(data: bytes, at: int) -> str:
    return data[at:data.index(b"\0", at)].decode("utf-8", "replace")


def _is_call(elf: _Elf, section: _Section, offset: int, kind: int) -> bool:
    if kind in _CALLS.get(elf.machine, ()):
        return True
    if elf.machine == _EM_X86_64 and kind in _CALL_BY_OPCODE and section.flags & _SHF_EXECINSTR:
        width, opcodes = _CALL_BY_OPCODE[kind]
        return elf.data[section.offset + offset - width:section.offset + offset] in opcodes
    return False


def function_addresses(elf: _Elf) -> list[tuple[str, str]]:
    """(where, function) for each library function whose address the object's host code or data
    takes without calling it: a relocation other than a call against an undefined symbol that
    is a function (a C++ name with parameters, or a plain C name that is not data). The
    compiler's own are left out (the personality routine, a vtable's entries and fillers,
    destructors it registers for static objects: C++ cannot take a destructor's address)."""
    found = []
    for section, offset, kind, sym in elf.relocations():
        if sym.section == 0 and sym.name and sym.name not in _COMPILERS_OWN | _C_DATA \
                and _in_host_code_or_data(section) and not _is_call(elf, section, offset, kind):
            where = elf.enclosing(section, offset)
            if not where.startswith("_ZTV"):   # a vtable's entries are the compiler's
                found.append((where, sym.name))
    names = _demangle(sorted({n for pair in found for n in pair}))
    return [(names[w], names[f]) for w, f in dict.fromkeys(found)
            if ("(" in names[f] and "::~" not in names[f]) or re.fullmatch(r"\w+", names[f])]


def _in_host_code_or_data(section: _Section) -> bool:
    """Loaded with the host code, and not unwind data (which names the personality routine)."""
    return bool(section.flags & _SHF_ALLOC) and not _DEVICE_SECTIONS.match(section.name) \
        and section.name not in (".eh_frame", ".gcc_except_table")


def _demangle(names: list[str]) -> dict[str, str]:
    cxxfilt = shutil.which("c++filt")
    if cxxfilt is None:
        raise AuditUnavailable("binutils' c++filt is missing (install binutils)")
    out = subprocess.run([cxxfilt], input="\n".join(names), capture_output=True, text=True,
                         errors="replace", timeout=120).stdout.splitlines()
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


def magic_numbers(elf: _Elf) -> list[tuple[str, str]]:
    """(where, what) for the ELF header's magic and DT_GNU_HASH in host code or data (x86-64
    immediates are little-endian in the instruction's bytes; a string is its bytes). The
    object's own ELF header is not in a section; the device code's fatbinary, full of ELF
    headers, is left out."""
    found = []
    for section in elf.host_sections():
        body = elf.bytes_of(section)
        for what, pattern in (("the ELF header's magic number (0x464c457f, \"\\x7fELF\")", ELF_MAGIC),
                              ("DT_GNU_HASH (0x6ffffef5), the tag of a library's symbol hash table",
                               DT_GNU_HASH)):
            at = body.find(pattern)
            if at >= 0:
                found.append((elf.enclosing(section, at), what))
    names = _demangle(sorted({w for w, _ in found}))
    return [(names[w], what) for w, what in found]


def page_masks(obj: Path) -> list[tuple[str, str]]:
    """(function, instruction) for each host instruction that masks an address to its 4 KiB
    page (x86-64, objdump): where a walk through memory starts."""
    found = []
    function = ""
    for line in _disassembly(obj).splitlines():
        head = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if head:
            function = head.group(1)
        elif re.search(r"\band[lq]?\s+\$0x(?:f{13}|f{5})000,", line):
            found.append((function, line.split("\t")[-1].strip()))
    return found


@functools.lru_cache(maxsize=2)
def _disassembly_cached(obj: str, mtime_ns: int, size: int) -> str:
    objdump = shutil.which("objdump")
    if objdump is None:
        raise AuditUnavailable("binutils' objdump is missing (install binutils; g++ brings it)")
    proc = subprocess.run([objdump, "-d", "-C", "--no-show-raw-insn", obj], capture_output=True,
                          text=True, errors="replace", timeout=300)
    if proc.returncode != 0:
        raise AuditUnavailable(f"objdump could not read {Path(obj).name}: {proc.stderr.strip()[:300]}")
    return proc.stdout


def _disassembly(obj: Path) -> str:
    """The object's host code, disassembled (objdump -d, demangled), once per file version."""
    st = os.stat(obj)
    return _disassembly_cached(str(obj), st.st_mtime_ns, st.st_size)


# What only the source text shows (comments left out), a note for the instructor: magic numbers
# of ELF, page masks, return and frame addresses (by line); integers cast to pointers (a cast to
# a pointer type whose operand starts with an integer: a literal, an integer type, or a variable
# the file declares as one); assembly for the host CPU (an asm statement with x86 registers or
# instructions; a kernel's PTX has neither).
TEXT_NOTES = [(why, re.compile(pattern)) for why, pattern in (
    ("a magic number of ELF (a library's header or symbol table)",
     r"0[xX]464[cC]457[fF]|\\(?:x7[fF]|177)(?:\"\s*\")?ELF|\bELFMAG\b|0[xX]6[fF]{4}[eE][fF]5|\bDT_GNU_HASH\b|"
     r"\bElf(?:32|64|W)_\w+|\bPT_DYNAMIC\b"),
    ("a page mask or page size", r"~\s*(?:\w+\s*)?\(?\s*0[xX]0*[fF]{3}\b|0[xX](?:[fF]{5}|[fF]{13})000\b|"
                                 r"\bgetpagesize\b|_SC_PAGE_?SIZE\b|~\s*\(\s*4096\s*-\s*1\s*\)|"
                                 r"&\s*-\s*4096\b"),
    ("a return or frame address", r"__builtin_(?:return|frame|extract_return)_addr(?:ess)?\b"),
)]
_INTEGER_TYPE = r"(?:u?intptr_t|size_t|ssize_t|ptrdiff_t|u?int64_t|(?:unsigned\s+)?long(?:\s+long)?)"
_INTEGER_VARIABLE = re.compile(rf"\b{_INTEGER_TYPE}\s+(?:const\s+)?(\w+)\s*[=;,)\[{{]|"
                               rf"\bauto\s+(\w+)\s*=\s*reinterpret_cast\s*<\s*{_INTEGER_TYPE}\s*>")
_POINTER_CAST = re.compile(r"reinterpret_cast\s*<[^<>;]*\*\s*>\s*\(\s*\(?\s*([\w~]+)|"
                           r"\(\s*(?:const\s+|volatile\s+)*\w+(?:\s+const)?\s*\*+\s*\)\s*\(?\s*([\w~]+)")
_ASM = re.compile(r"\b(?:asm|__asm__|__asm)\b\s*(?:volatile|__volatile__|goto|inline|\s)*\(")
_HOST_ASM = re.compile(r"%%[re]?(?:ax|bx|cx|dx|si|di|sp|bp)\b|\b(?:syscall|sysenter|rdtscp?|cpuid|"
                       r"rdpid|rdrand)\b|\bint\s+\$?0x80\b")


def text_notes(source: str) -> list[str]:
    """'file line N: what: code' for what the C++ files of read_sources' text show (comments
    left out): TEXT_NOTES by line, integers cast to pointers, assembly for the host CPU."""
    notes = []
    for name, text in split_sources(source).items():
        if name.endswith(".py"):
            continue
        name = name or _SOURCE_NAME
        code = re.sub(r"//[^\n]*|/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text,
                      flags=re.DOTALL)
        lines = code.split("\n")
        integers = {a or b for a, b in _INTEGER_VARIABLE.findall(code)}
        for number, line in enumerate(lines, 1):
            notes += [f"{name} line {number}: {why}: {line.strip()[:120]}"
                      for why, pattern in TEXT_NOTES if pattern.search(line)]
            if any(_is_integer(a or b, integers) for a, b in _POINTER_CAST.findall(line)):
                notes.append(f"{name} line {number}: an integer cast to a pointer: {line.strip()[:120]}")
        for m in _ASM.finditer(code):
            body = code[m.end():m.end() + 4000].split(");", 1)[0]
            if _HOST_ASM.search(body):
                number = code.count("\n", 0, m.start()) + 1
                notes.append(f"{name} line {number}: inline assembly for the host CPU: "
                             f"{lines[number - 1].strip()[:120]}")
    return notes


def _is_integer(operand: str, integers: set[str]) -> bool:
    return operand in integers or re.fullmatch(_INTEGER_TYPE, operand) is not None \
        or re.fullmatch(r"~?(?:0[xX][0-9a-fA-F]+|\d+)[uUlL]*", operand) is not None


def native_review(build_dir: Path, source: str) -> tuple[list[ReachFinding], list[str]]:
    """What an instructor must see of a CUDA build the audit let through: the findings that send
    it to review, and notes ('where: what') on every unusual but allowed construct, those
    findings' among them.

    To review (read from the object and the compiler's record, never from text; none in any
    honest C++ submission, measured: README):
      - the address of a library function taken as data, not called (function_addresses):
        where a walk through a library's memory starts;
      - the ELF header's magic number or DT_GNU_HASH in host code or data (magic_numbers): what
        a walk looks for to find a library's symbols;
      - <elf.h>, <link.h> or <sys/auxv.h> opened (LOADER_HEADERS): the loader's structures.
    Notes only: a page mask in host code (page_masks), headers for memory and process
    introspection (NOTED_HEADERS), and what the source text shows (text_notes)."""
    from .build import HEADERS_RECORD, STUDENT_OBJECT
    obj = Path(build_dir) / STUDENT_OBJECT
    elf = read_elf(obj)
    review = [ReachFinding(f"{obj.name}, in {where}", f"&{function}",
                           "a library function's address taken as data, not called")
              for where, function in function_addresses(elf)]
    review += [ReachFinding(f"{obj.name}, in {where}", what, "a magic number of ELF in host code")
               for where, what in magic_numbers(elf)]
    headers = read_headers_record(Path(build_dir) / HEADERS_RECORD)
    review += [ReachFinding(f"{_SOURCE_NAME}, as compiled", h, "the dynamic loader's structures")
               for h in headers if LOADER_HEADERS.search(h)]
    notes = [f"{f.where}: {f.what}: {f.why}" for f in review]
    notes += [f"{obj.name}, in {where}: a page mask: {insn}" for where, insn in page_masks(obj)]
    notes += [f"{_SOURCE_NAME}, as compiled: {h}: a header for memory or process introspection"
              for h in headers if NOTED_HEADERS.search(h)]
    return review, notes + text_notes(source)


# ---------------------------------------------------------------- the verdict


def verdict(findings: list[ReachFinding], limit: int = 6) -> str:
    """The flag's text ('' when there is nothing to flag)."""
    if not findings:
        return ""
    lines = ["reaches past its kernel: the code uses ways into the grader's process, other "
             "processes or native code that no FlashAttention kernel needs (the grader audits "
             "them before running anything; see README, 'Integrity'). Remove them:"]
    lines += [f"  {f.describe()}" for f in findings[:limit]]
    if len(findings) > limit:
        lines.append(f"  ... and {len(findings) - limit} more")
    return "\n".join(lines)

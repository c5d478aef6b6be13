"""Reach: what a submission's code could get at, read by the grader from what it holds before any of
that code runs. Trusted side: nothing here imports, loads or executes a submission.

Why. Which kernels ran is reported by the subject process (grader/subject/loop.py lists them from
its own profiler). A submission runs in that process, so it can rewrite the report, but only by
reaching the grader's objects or memory there: Python's reflection (modules, frames, the garbage
collector, dynamic code), native code loaded behind the grader's back, or, from C++, the Python
C API, the dynamic linker and the operating system. Those are the audited ways in.

Invariant. A submission is ranked only if
  - Python: every .py file of its folder was read (a file read_sources skipped is a finding) and
    is UTF-8 as Python will read it; parsed with `ast`, never imported, none imports a module
    outside ALLOWED_IMPORTS or its own files (a local gc.py is not what `import gc` loads); names
    anything on REACH_NAMES or REACH_PARTS, in code, keywords, match patterns or string
    annotations (which are code); touches a private attribute; names a dunder outside
    ALLOWED_DUNDERS (`if __name__ == "__main__":` is fine); uses a module as a value; or follows
    a path through an allowed module to a module outside them (`enum.bltns` is builtins,
    resolved in the grader's own import of the library). The subject then imports the folder's
    .py sources only (subject/loop.py, SourceOnly).
  - CUDA C++: the object compiled from its translation unit (build.STUDENT_OBJECT, built without
    importing the module, so none of its code has run) imports no symbol on NATIVE_REACH (the
    Python C API, the dynamic linker and PyTorch's wrapper of it, driver entry points and module
    loaders, other processes' memory, threads, files, the profiler, cuBLAS, cuDNN, the
    dispatcher), no plain C function outside C_ALLOWED (of the driver: tensor-map encoding
    only, DRIVER_ALLOWED), no PyTorch operator that computes (at::_ops or a backend namespace,
    outside DATA_OPS), its host code has no system call
    instruction, and it compiles no library's kernel (library_kernels: CUTLASS's, by the rule
    integrity.classify_launched applies to what runs; CuTe-templated kernels are the student's).

What it cannot see, and says so in README: a gadget chain through some public attribute of torch
or Triton not on these lists, and machine code that finds functions by walking mapped memory
itself (no import, no system call). A red team wrote 18 attacks against the first version of this
file (13 in Python, 5 in C++, tests/test_reach.py has their shapes); each is flagged now.
Everything else a submission reports about itself stays a claim the trusted side weighs
(grader/integrity.py).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import os
import posixpath
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

# Modules a submission.py may import (the top-level package; its own files are allowed too).
ALLOWED_IMPORTS = frozenset({
    "torch", "triton", "numpy", "math", "cmath", "typing", "functools", "itertools",
    "dataclasses", "enum", "collections", "abc", "contextlib", "random", "time", "warnings",
    "__future__", "tilelang", "cutlass"})

# The allowed modules whose attribute paths the audit follows in its own import of them (trusted
# libraries, imported here without touching the GPU); tilelang's paths are checked against
# TILELANG_API below, cutlass's by name only.
RESOLVED_IMPORTS = frozenset({"torch", "triton", "numpy", "math", "cmath", "typing", "functools",
                              "itertools", "dataclasses", "enum", "collections", "abc",
                              "contextlib", "random", "time", "warnings"})

# Names that open a way to the grader's objects or to native code, wherever they appear: a name,
# an attribute, an imported name or module path, a keyword argument, a match pattern.
REACH_NAMES = frozenset("""
sys modules os posix nt gc inspect ctypes ctypeslib cffi importlib import_module builtins bltns
eval exec compile getattr setattr delattr vars globals locals dir open breakpoint input
subprocess multiprocessing threading signal atexit weakref pickle marshal shelve copyreg
mmap fcntl resource socket pty shutil pathlib io runpy code codeop types operator
attrgetter methodcaller get_type_hints ForwardRef evaluate_forward_ref singledispatch
singledispatchmethod
f_back f_globals f_locals f_builtins f_code tb_frame tb_next gi_frame cr_frame ag_frame gi_code
cudart nvtx package sys_importer hub cpp_extension load_inline load_library
compile_module_from_src load_binary fromfile from_file memmap frombuffer stride_tricks
serialization knobs ir_override
tofile savetxt savez savez_compressed open_memmap SummaryWriter dump
FileCacheManager get_cache_manager default_cache_dir cache_dir
weights_only allow_pickle pickle_module CUDAPluggableAllocator XPUPluggableAllocator
change_current_allocator FunctionEvent EventList overrides library mro share_memory_
set_trace settrace setprofile
""".split())
# ... and any name containing these (the profiler and its event classes, under any name).
REACH_PARTS = re.compile(r"profil|kineto|cupti", re.IGNORECASE)

# Attribute paths that run code from a file or load native code, resolved through the module
# aliases a file imports (`import torch as t; t.load(...)` and `from torch import load` are both
# `torch.load`).
REACH_PATHS = frozenset({"torch.load", "numpy.load", "torch.jit.load", "torch.ops.load_library"})
# ... and that write files (with the names tofile, savetxt, savez, open_memmap, SummaryWriter,
# ndarray.dump, and Triton's cache manager, which also names the JIT cache's folder, above). A kernel writes no file, and a JIT compiler's cache folder (pipeline.jit_cache, $HOME in
# the sandbox) is where Triton finds the launcher library it loads: bytes written there by the
# submission would be native code that no audit read (red team, session 8).
WRITE_PATHS = frozenset({"torch.save", "numpy.save", "torch.jit.save", "torch.export.save",
                         "torch.onnx.export"})

ALLOWED_DUNDERS = frozenset({
    "__init__", "__name__", "__call__", "__len__", "__repr__", "__str__", "__eq__", "__hash__",
    "__post_init__", "__future__", "__all__", "__doc__", "__slots__", "__enter__", "__exit__",
    "__iter__", "__next__", "__getitem__", "__file__", "__version__"})

# TileLang (issue 15). Its JIT compiles the kernel's host side too, and loads it into the subject,
# so it has ways past the kernel that Triton has not: source text spliced into the compiled module
# (T.import_source, T.Kernel's prelude, CUDASourceCodeKernel, postprocessing hooks), calls out to
# any C function or TVM global function from the host code (T.call_extern, T.call_packed, the
# tvm_* builtins), the compiler's command line (compile_flags: nvcc's -ccbin runs any program),
# targets that hand work to libraries or the CPU, and its packaged templates (tilelang.carver).
# The rule: a submission that imports tilelang uses tilelang.<TILELANG_API> only, and
# tilelang.language (T) without its submodules; no name on TILELANG_REACH appears anywhere in its
# files, in code, keywords or strings; and no call spreads a dict of keywords (`f(**options)`
# could spell a keyword the audit never sees). What remains is tile code whose host side TileLang
# generates itself: a kernel of the student's own, named after its @T.prim_func
# (integrity.own_kernel_names).
TILELANG_API = frozenset({"jit", "compile", "language", "cdiv", "next_power_of_2"})
TILELANG_REACH = frozenset("""
call_extern call_pure_extern call_packed call_cpacked call_packed_lowered call_cpacked_lowered
call_intrin call_llvm_intrin call_llvm_pure_intrin llvm_lookup_intrinsic_id call_kernel
import_source prelude CUDASourceCodeKernel func_attr register_cuda_postproc register_hip_postproc
register_c_postproc get_global_func target_host compile_flags execution_backend debug_root_path
pass_configs Call CallEffectKind JITFunc
""".split())
# ... and, as a keyword, `target` (a CPU target, or one whose libs hand the work to cuBLAS).
TILELANG_KEYWORDS = TILELANG_REACH | {"target"}
# tilelang.language's submodules (0.1.15): T.tir, T.builtin, ... lead past the tile API.
TILELANG_LANGUAGE_MODULES = frozenset("""
annotations atomic builtin common copy_op customize dtypes eager experimental fill_op frame
gemm_op kernel logical loop math_intrinsics meta overrides proxy reduce_op scan_op symbolics
tile_schedule tir utils warp_specialize""".split())
_TILELANG_PREFIX = re.compile(r"^(tvm|TVM)")   # tvm_call_packed, TVMBackendAllocWorkspace, ...
# ... and any name built on one of those (T.annotate_compile_flags, T.annotate_pass_configs,
# T.anylist_setitem_call_packed), in code or in a string without spaces.
_TILELANG_PARTS = re.compile(r"compile_flags|pass_config|call_c?packed|extern|import_source|"
                             r"prelude|postproc|execution_backend|target_host")
# TileLang's compilers: called with the kernel alone (their positional options are the target,
# the execution backend, pass configs and compiler flags), never passed around as a value.
TILELANG_COMPILERS = frozenset({"tilelang.compile", "tilelang.jit"})
# Strings that name an operator or a global function (T.Call("int32", "tir.call_extern", ...));
# a docstring that speaks of intrinsics has spaces in it.
_TILELANG_STRING = re.compile(
    r"^\S*(extern|packed|intrin|^(tir|tl|tvm|runtime|ffi|target|device_api)\.)\S*$")
_TILELANG_WHY = ("TileLang's way past the kernel: raw source, host calls, the compiler's command "
                 "line or the target (grader/reach.py, TILELANG_REACH)")

# The encodings the audit reads a file in; Python honours a file's coding cookie, so any other
# would make the audited text differ from the code that runs.
READABLE_CODECS = frozenset({"utf-8", "utf8", "utf_8", "utf-8-sig", "ascii", "us-ascii"})
_COOKIE = re.compile(r"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)", re.MULTILINE)
_DUNDER = re.compile(r"^__\w+__$")

# ---------------------------------------------------------------- native: the object's imports

# PyTorch operators that create, view, copy or move tensors (the `aten::` names of
# integrity.CPU_ALLOWED_OPS); every other operator computes, and computing is the submission's job.
from .integrity import CPU_ALLOWED_OPS  # noqa: E402
from .submission import split_sources  # noqa: E402

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


# ---------------------------------------------------------------- Python, by its syntax tree


def python_reach(files: dict[str, str]) -> list[ReachFinding]:
    """Findings for every Python file of a submission, {relative path: text}. A file Python
    would decode differently (a coding cookie) cannot be cleared; one that does not parse is left
    to the build, where importing it fails with the student's own SyntaxError."""
    own = _own_modules(files)
    # TileLang's rules hold for every file of a submission that mentions it anywhere.
    tilelang = any(re.search(r"\btilelang\b", text) for text in files.values())
    findings = []
    for name, text in files.items():
        if not name.endswith(".py"):
            continue
        cookie = _COOKIE.search("\n".join(text.split("\n")[:2]))
        if (cookie and cookie.group(1).lower() not in READABLE_CODECS) or "\ufffd" in text:
            findings.append(ReachFinding(name, cookie.group(0).strip() if cookie else "U+FFFD",
                                         "Python would read this file differently from the audit: "
                                         "save it as UTF-8"))
            continue
        try:   # Python drops a UTF-8 byte order mark before it parses; so does the audit
            tree = ast.parse(text.removeprefix("\ufeff"), filename=name)
        except (SyntaxError, ValueError):
            continue   # nor can Python run it: importing it fails with the student's own error
        findings += _Audit(name, own, tilelang=tilelang).run(tree)
    return findings


def _own_modules(files: dict[str, str]) -> set[str]:
    """Top-level modules a submission's folder provides and the grader read (x.py, x/...py),
    except names Python finds elsewhere first (a gc.py beside the submission is not what
    `import gc` loads)."""
    own = set()
    for name in files:
        parts = Path(name).parts
        if name.endswith(".py"):
            own.add(parts[0][:-3] if len(parts) == 1 else parts[0])
    shadowed = set(sys.builtin_module_names) | set(getattr(sys, "stdlib_module_names", ())) | REACH_NAMES
    return own - shadowed


@functools.lru_cache(maxsize=4096)
def _resolve(path: str):
    """The module an attribute path names, looked up in the grader's own import of an allowed
    library (trusted code); None when the path is not a module or cannot be resolved."""
    parts = path.split(".")
    if parts[0] not in RESOLVED_IMPORTS:
        return None
    try:
        obj = importlib.import_module(parts[0])
        for part in parts[1:]:
            obj = getattr(obj, part)
    except Exception:   # not installed here, or not an attribute: nothing to resolve
        return None
    return obj if isinstance(obj, types.ModuleType) else None


class _Audit(ast.NodeVisitor):
    def __init__(self, file: str, own: set[str], *, tilelang: bool = False):
        self.file, self.own, self.tilelang = file, own, tilelang
        self.findings: list[ReachFinding] = []
        self.aliases: dict[str, str] = {}    # local name -> the module path it stands for
        self.idiom: set[int] = set()         # ids of '__main__' constants in the main idiom
        self.bases: set[int] = set()         # ids of nodes that are the base of an attribute
        self.called: set[int] = set()        # ids of nodes called, or used as a decorator

    def run(self, tree: ast.AST) -> list[ReachFinding]:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                self.called.add(id(node.func))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.called |= {id(d) for d in node.decorator_list}
            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) \
                    and node.left.id == "__name__":
                self.idiom |= {id(c) for c in node.comparators if isinstance(c, ast.Constant)}
            if isinstance(node, ast.Attribute):
                self.bases.add(id(node.value))
        self.visit(tree)
        return self.findings

    def flag(self, node: ast.AST, what: str, why: str) -> None:
        self.findings.append(ReachFinding(f"{self.file} line {getattr(node, 'lineno', '?')}", what, why))

    def check_name(self, node: ast.AST, name: str, *, attribute_of: str | None = None) -> None:
        if name in REACH_NAMES or REACH_PARTS.search(name):
            self.flag(node, name, "a way to the grader's objects, other processes or native code")
        elif _DUNDER.match(name) and name not in ALLOWED_DUNDERS:
            self.flag(node, name, "Python's internals: no kernel needs them")
        elif attribute_of is not None and name.startswith("_") and not _DUNDER.match(name):
            self.flag(node, f"{attribute_of}.{name}", "a private attribute: no kernel needs it")
        elif self.tilelang and (name in TILELANG_REACH or _TILELANG_PREFIX.match(name)
                                or _TILELANG_PARTS.search(name)):
            self.flag(node, name, _TILELANG_WHY)

    def check_compiler_use(self, node: ast.AST, path: str | None) -> None:
        """TileLang's compiler may be called or be a decorator, not be a value: a value can be
        called later with the positional options visit_Call rules out."""
        if self.tilelang and path in TILELANG_COMPILERS and id(node) not in self.called:
            self.flag(node, path, "TileLang's compiler used as a value: call it (or decorate with "
                      "it) where it is named, with the kernel alone and keywords")

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        path = self._path(func) if isinstance(func, ast.Attribute) else \
            self.aliases.get(func.id) if isinstance(func, ast.Name) else None
        if self.tilelang and path in TILELANG_COMPILERS and (
                len(node.args) > 1 or any(isinstance(a, ast.Starred) for a in node.args)):
            self.flag(node, f"{path}(...)", "TileLang's compiler takes the kernel alone: its "
                      "positional options are the target, the execution backend, pass configs "
                      "and compiler flags (write out_idx= as a keyword)")
        self.generic_visit(node)

    def check_module(self, node: ast.AST, module: str, level: int = 0) -> None:
        if level:   # relative: a file of its own folder, read and audited with the rest
            return
        top = module.split(".")[0]
        if top not in ALLOWED_IMPORTS and top not in self.own:
            self.flag(node, f"import {module}", f"not a module a kernel needs (allowed: "
                      f"{', '.join(sorted(ALLOWED_IMPORTS - {'__future__'}))} and its own files)")
        for part in module.split(".")[1:]:
            self.check_name(node, part, attribute_of=top)
        self.check_path(node, module)

    def check_path(self, node: ast.AST, path: str) -> None:
        """A path through allowed modules may not arrive at a module outside them
        (`enum.bltns` is builtins), nor at something that runs a file's code (REACH_PATHS)."""
        if path in REACH_PATHS:
            self.flag(node, path, "runs code from a file or loads native code")
        if path in WRITE_PATHS:
            self.flag(node, path, "writes a file: a cache a compiler loads from could be "
                      "given native code no audit read")
        parts = path.split(".")
        if parts[0] == "tilelang" and len(parts) > 1 and (
                parts[1] not in TILELANG_API or   # tilelang.jit.kernel is a module, not the API
                (parts[1] != "language" and len(parts) > 2) or
                (parts[1] == "language" and len(parts) > 2 and parts[2] in TILELANG_LANGUAGE_MODULES)):
            self.flag(node, path, f"outside TileLang's tile API (allowed: tilelang."
                      f"{{{', '.join(sorted(TILELANG_API))}}} and tilelang.language without its "
                      f"submodules)")
        module = _resolve(path)
        if module is not None and module.__name__.split(".")[0] not in ALLOWED_IMPORTS:
            self.flag(node, path, f"is the module {module.__name__}, reached through another module")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.check_module(node, alias.name)
            local = alias.asname or alias.name.split(".")[0]
            self.aliases[local] = alias.name if alias.asname else local
            if alias.asname:
                self.check_name(node, alias.asname)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        self.check_module(node, module, node.level)
        for alias in node.names:
            if alias.name == "*":
                self.flag(node, f"from {module} import *", "hides which names the file uses")
                continue
            self.check_name(node, alias.name, attribute_of=module or ".")
            if alias.asname:
                self.check_name(node, alias.asname)
            if not node.level:
                self.check_path(node, f"{module}.{alias.name}")
                self.aliases[alias.asname or alias.name] = f"{module}.{alias.name}"

    def visit_Name(self, node: ast.Name) -> None:
        self.check_name(node, node.id)
        path = self.aliases.get(node.id)
        self.check_compiler_use(node, path)
        if path and id(node) not in self.bases and isinstance(node.ctx, ast.Load) \
                and _resolve(path) is not None:
            self.flag(node, node.id, "a module used as a value (only module.attribute is allowed)")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        path = self._path(node)
        if path != "tilelang.compile":   # TileLang's compiler, not the builtin
            self.check_name(node, node.attr,
                            attribute_of=node.value.id if isinstance(node.value, ast.Name) else "an object")
        if path:
            self.check_path(node, path)
            self.check_compiler_use(node, path)
            if id(node) not in self.bases and _resolve(path) is not None:
                self.flag(node, path, "a module used as a value (only module.attribute is allowed)")
        self.generic_visit(node)

    def visit_keyword(self, node: ast.keyword) -> None:
        if node.arg:
            self.check_name(node, node.arg)
            if self.tilelang and node.arg in TILELANG_KEYWORDS - TILELANG_REACH:
                self.flag(node, f"{node.arg}=", _TILELANG_WHY)
        elif self.tilelang:
            self.flag(node, "**", "keywords spread from a dict: with TileLang, every keyword must "
                      "be written out (compile_flags, target, ... are ways past the kernel)")
        self.generic_visit(node)

    def visit_MatchClass(self, node: ast.MatchClass) -> None:   # case C(attr=...) reads attr
        for name in node.kwd_attrs:
            self.check_name(node, name, attribute_of="an object")
        self.generic_visit(node)

    def visit_FunctionDef(self, node) -> None:
        self.check_name(node, node.name)
        arguments = node.args
        for arg in arguments.posonlyargs + arguments.args + arguments.kwonlyargs \
                + [a for a in (arguments.vararg, arguments.kwarg) if a]:
            self.annotation(arg.annotation)
        self.annotation(node.returns)
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.annotation(node.annotation)
        self.generic_visit(node)

    def annotation(self, node: ast.AST | None) -> None:
        """A string annotation is code: typing.get_type_hints and others evaluate it."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                tree = ast.parse(node.value, mode="eval")
            except SyntaxError:
                self.flag(node, repr(node.value)[:60], "a string annotation that is not an expression")
                return
            inner = _Audit(f"{self.file} line {node.lineno}, annotation", self.own,
                           tilelang=self.tilelang)
            inner.aliases = dict(self.aliases)
            self.findings += inner.run(tree)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.check_name(node, node.name)
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and id(node) not in self.idiom and (
                node.value in REACH_NAMES or
                (_DUNDER.match(node.value) and node.value not in ALLOWED_DUNDERS) or
                (self.tilelang and (node.value in TILELANG_KEYWORDS
                                    or _TILELANG_STRING.search(node.value)
                                    or (" " not in node.value and _TILELANG_PARTS.search(node.value))))):
            self.flag(node, repr(node.value)[:60], "a string naming a way in")

    def _path(self, node: ast.AST) -> str:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in self.aliases:
            return ""
        return ".".join([self.aliases[node.id]] + parts[::-1])


# ---------------------------------------------------------------- native, by the object's symbols


class AuditUnavailable(RuntimeError):
    """The grading machine cannot read object files (binutils' nm is missing)."""


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
    """Findings for the imports of the object compiled from a submission's translation unit, and
    for system calls its host code makes without one."""
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
    return findings


def defined_kernels(obj: Path) -> list[str]:
    """The GPU kernels the object's translation unit defines, demangled. nvcc gives each
    __global__ function a host stub under the kernel's own mangled name, and a
    `__device_stub__` function beside it (or, once inlined, its static locals) whose name holds
    that mangled name, length-prefixed: `74__device_stub__Z17attention_kernel1ILi64E...`."""
    nm, cxxfilt = shutil.which("nm"), shutil.which("c++filt")
    if nm is None or cxxfilt is None:
        raise AuditUnavailable("binutils' nm or c++filt is missing (install binutils)")
    proc = subprocess.run([nm, "--defined-only", "--format=just-symbols", str(obj)],
                          capture_output=True, text=True, errors="replace", timeout=120)
    if proc.returncode != 0:
        raise AuditUnavailable(f"nm could not read {obj.name}: {proc.stderr.strip()[:300]}")
    symbols = proc.stdout.split()
    stubs = "\n".join(s for s in symbols if "__device_stub__" in s)
    kernels = [s for s in symbols if s.startswith("_Z") and "__device_stub__" not in s
               and f"{len(s) + 14}__device_stub__{s[1:]}" in stubs]
    if not kernels:
        return []
    proc = subprocess.run([cxxfilt], input="\n".join(kernels), capture_output=True, text=True,
                          errors="replace", timeout=120)
    return [line.strip() for line in proc.stdout.splitlines() if line.strip()]


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
    objdump = shutil.which("objdump")
    if objdump is None:
        raise AuditUnavailable("binutils' objdump is missing (install binutils; g++ brings it)")
    proc = subprocess.run([objdump, "-d", "--no-show-raw-insn", str(obj)], capture_output=True,
                          text=True, errors="replace", timeout=300)
    if proc.returncode != 0:
        raise AuditUnavailable(f"objdump could not read {obj.name}: {proc.stderr.strip()[:300]}")
    return re.search(r"\s(syscall|sysenter|int\s+\$0x80)\b", proc.stdout) is not None


def _data_op(name: str) -> bool:
    """at::_ops names carry the overload: empty_memory_format, transpose_int, to_dtype_layout."""
    parts = name.split("_")
    return any("_".join(parts[:i]) in DATA_OPS or "_" + "_".join(parts[1:i]) in DATA_OPS
               for i in range(1, len(parts) + 1))


def _native_reason(symbol: str) -> str | None:
    return next((why for why, pattern in NATIVE_REACH if pattern.match(symbol)), None)


# ---------------------------------------------------------------- the verdict


def audit_sources(source: str, folder: Path | None = None) -> list[ReachFinding]:
    """python_reach of the Python files in read_sources' text; with the folder, also every .py
    there that read_sources did not read (too large, too many, a link, a hidden folder): it could
    still be imported, and what was not read cannot be cleared."""
    files = split_sources(source)
    findings = python_reach(files)
    if folder is not None:
        findings += _unread(Path(folder), set(files))
    return findings


# CUTLASS's kernel-level headers: whole GEMM, convolution, reduction and transform kernels, their
# collectives and epilogues. A kernel of the student's own may use CuTe (cute/...) and CUTLASS's
# building blocks (cutlass/arch, cutlass/pipeline, numeric types, barriers), none of which
# includes these; one that includes them can run CUTLASS's GEMM inside a __global__ of its own,
# where no kernel name shows it (red team, session 7: tests/adversarial/cutlass_wrapped_cu).
CUTLASS_KERNEL_HEADERS = re.compile(r"^cutlass/(gemm|conv|epilogue|reduction|transform|fmha)/")
_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include\b[ \t]*(.*)$", re.MULTILINE)


def cpp_includes(source: str) -> list[ReachFinding]:
    """What the C++ files of read_sources' text include that no kernel of the student's own
    needs: CUTLASS's kernel-level headers (CUTLASS_KERNEL_HEADERS, after '..' is resolved), and
    an include whose file is computed by a macro (it could name one)."""
    findings = []
    for name, text in split_sources(source).items():
        if name.endswith(".py"):
            continue
        for m in _INCLUDE.finditer(text):
            where = f"{name or 'source'} line {text.count(chr(10), 0, m.start()) + 1}"
            target = re.match(r'^[<"]([^>"]*)[>"]', m.group(1).strip())
            if target is None:
                findings.append(ReachFinding(where, m.group(0).strip()[:80], "an include whose file "
                                             "a macro computes: write the header's name"))
            elif CUTLASS_KERNEL_HEADERS.match(posixpath.normpath(target.group(1))):
                findings.append(ReachFinding(where, target.group(1), "CUTLASS's kernel-level "
                                             "headers (GEMM, convolution, collectives, epilogues): "
                                             "a library's kernel; CuTe and cutlass/arch are fine"))
    return findings


def _unread(folder: Path, read: set[str], limit: int = 20_000) -> list[ReachFinding]:
    findings, seen = [], 0
    for root, dirs, names in os.walk(folder, followlinks=False):
        dirs.sort()
        for entry in sorted(names) + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            seen += 1
            if seen > limit:
                return findings + [ReachFinding(str(folder.name), f"more than {limit} files",
                                                "too many files to audit")]
            rel = os.path.relpath(os.path.join(root, entry), folder)
            if (entry.endswith(".py") or os.path.islink(os.path.join(root, entry))) and rel not in read:
                findings.append(ReachFinding(rel, rel, "a Python file or link the grader did not "
                                             "read (too large, too many, a link or hidden): it "
                                             "could still be imported; remove it"))
    return findings


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

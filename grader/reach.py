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
    dispatcher), no plain C function outside C_ALLOWED, no PyTorch operator that computes
    (at::_ops or a backend namespace, outside DATA_OPS), and its host code has no system call
    instruction.

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
# libraries, imported here without touching the GPU); tilelang and cutlass paths are checked by
# name only.
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
serialization
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

ALLOWED_DUNDERS = frozenset({
    "__init__", "__name__", "__call__", "__len__", "__repr__", "__str__", "__eq__", "__hash__",
    "__post_init__", "__future__", "__all__", "__doc__", "__slots__", "__enter__", "__exit__",
    "__iter__", "__next__", "__getitem__", "__file__", "__version__"})

# The encodings the audit reads a file in; Python honours a file's coding cookie, so any other
# would make the audited text differ from the code that runs.
READABLE_CODECS = frozenset({"utf-8", "utf8", "utf_8", "utf-8-sig", "ascii", "us-ascii"})
_COOKIE = re.compile(r"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)", re.MULTILINE)
_DUNDER = re.compile(r"^__\w+__$")

# ---------------------------------------------------------------- native: the object's imports

# PyTorch operators that create, view, copy or move tensors (the `aten::` names of
# integrity.CPU_ALLOWED_OPS); every other operator computes, and computing is the submission's job.
from .integrity import CPU_ALLOWED_OPS  # noqa: E402

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

# Plain C symbols (no namespace) an object may import: the CUDA runtime's launch and query calls,
# the C++ runtime, memory and string functions, printing, allocation and math. Anything else
# (files, processes, threads, signals, memory mapping, raw system calls) is a way out.
C_ALLOWED = re.compile(r"""^(
    _GLOBAL_OFFSET_TABLE_ | __dso_handle | __libc_single_threaded | _Unwind_\w+ |
    __gxx_personality_v0 | __cxa_\w+ | __cuda\w+ | __nv\w+ |
    cuda(?!GetDriverEntryPoint|Ipc|Library|GetFuncBySymbol|Profiler)\w+ |
    atexit | abort | __assert_fail | __stack_chk_fail | __errno_location |
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
        findings += _Audit(name, own).run(tree)
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
    def __init__(self, file: str, own: set[str]):
        self.file, self.own = file, own
        self.findings: list[ReachFinding] = []
        self.aliases: dict[str, str] = {}    # local name -> the module path it stands for
        self.idiom: set[int] = set()         # ids of '__main__' constants in the main idiom
        self.bases: set[int] = set()         # ids of nodes that are the base of an attribute

    def run(self, tree: ast.AST) -> list[ReachFinding]:
        for node in ast.walk(tree):
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
        if path and id(node) not in self.bases and isinstance(node.ctx, ast.Load) \
                and _resolve(path) is not None:
            self.flag(node, node.id, "a module used as a value (only module.attribute is allowed)")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.check_name(node, node.attr,
                        attribute_of=node.value.id if isinstance(node.value, ast.Name) else "an object")
        path = self._path(node)
        if path:
            self.check_path(node, path)
            if id(node) not in self.bases and _resolve(path) is not None:
                self.flag(node, path, "a module used as a value (only module.attribute is allowed)")
        self.generic_visit(node)

    def visit_keyword(self, node: ast.keyword) -> None:
        if node.arg:
            self.check_name(node, node.arg)
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
            inner = _Audit(f"{self.file} line {node.lineno}, annotation", self.own)
            inner.aliases = dict(self.aliases)
            self.findings += inner.run(tree)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.check_name(node, node.name)
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and id(node) not in self.idiom and (
                node.value in REACH_NAMES or
                (_DUNDER.match(node.value) and node.value not in ALLOWED_DUNDERS)):
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
    from .submission import split_sources
    files = split_sources(source)
    findings = python_reach(files)
    if folder is not None:
        findings += _unread(Path(folder), set(files))
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

"""Reach: what a submission's code could get at, read by the grader from what it holds before any of
that code runs. Trusted side: nothing here imports, loads or executes a submission.

Why. Which kernels ran is reported by the subject process (grader/subject/loop.py lists them from
its own profiler). A submission runs in that process, so it can rewrite the report, but only by
reaching the grader's objects or memory there: Python's reflection (modules, frames, the garbage
collector, dynamic code), native code loaded behind the grader's back, or, from C++, the Python
C API, the dynamic linker and the operating system. Those are the audited ways in.

Invariant. A submission is ranked only if
  - Python: none of its source files (all of them are read, each parsed with `ast`, never
    imported) imports a module outside ALLOWED_IMPORTS or its own files, names anything in
    REACH_NAMES, touches a private attribute of something other than self/cls, or names a dunder
    outside ALLOWED_DUNDERS (the `if __name__ == "__main__":` idiom is allowed);
  - CUDA C++: the object file compiled from its translation unit (build.STUDENT_OBJECT, built
    without importing the module, so no code of it has run) imports no symbol that NATIVE_REACH
    matches (the Python C API, the dynamic linker, driver entry points and module loaders,
    processes, threads, files, raw memory, the profiler, PyTorch's dispatcher) and no PyTorch
    operator that computes (at::_ops outside DATA_OPS: matmul, softmax, attention, ...).

What it cannot see, and says so in README: a hand-written gadget chain through some public
attribute of torch or Triton not on these lists, and machine code that finds functions by walking
mapped memory itself (no import, no system call). Everything else a submission reports about
itself stays a claim the trusted side weighs (grader/integrity.py).
"""

from __future__ import annotations

import ast
import dataclasses
import re
import shutil
import subprocess
from pathlib import Path

# Modules a submission.py may import (the top-level package; its own files are allowed too).
ALLOWED_IMPORTS = frozenset({
    "torch", "triton", "numpy", "math", "cmath", "typing", "functools", "itertools",
    "dataclasses", "enum", "collections", "abc", "contextlib", "random", "time", "warnings",
    "__future__", "tilelang", "cutlass"})

# Names that open a way to the grader's objects or to native code, wherever they appear: a name,
# an attribute, an imported name or module path, a keyword argument.
REACH_NAMES = frozenset("""
sys modules os posix nt gc inspect ctypes ctypeslib cffi importlib import_module builtins
eval exec compile getattr setattr delattr vars globals locals dir open breakpoint input
subprocess multiprocessing threading signal atexit weakref pickle marshal shelve copyreg
mmap fcntl resource socket pty shutil pathlib io runpy code codeop
f_back f_globals f_locals f_builtins f_code tb_frame tb_next gi_frame cr_frame ag_frame gi_code
profiler autograd_profiler cudart nvtx package sys_importer hub cpp_extension load_inline
load_library compile_module_from_src load_binary fromfile from_file memmap frombuffer
serialization overrides library mro share_memory_ set_trace settrace setprofile
""".split())

# Attribute paths that run code or load native code, resolved through the module aliases a file
# imports (`import torch as t; t.load(...)` is `torch.load`).
REACH_PATHS = frozenset({"torch.load", "numpy.load", "torch.jit.load", "torch.ops.load_library"})

ALLOWED_DUNDERS = frozenset({
    "__init__", "__name__", "__call__", "__len__", "__repr__", "__str__", "__eq__", "__hash__",
    "__post_init__", "__future__", "__all__", "__doc__", "__slots__", "__enter__", "__exit__",
    "__iter__", "__next__", "__getitem__", "__file__", "__version__"})

_DUNDER = re.compile(r"^__\w+__$")

# ---------------------------------------------------------------- native: the object's imports

# PyTorch operators that create, view, copy or move tensors (the `aten::` names of
# integrity.CPU_ALLOWED_OPS); every other operator computes, and computing is the submission's job.
from .integrity import CPU_ALLOWED_OPS  # noqa: E402

DATA_OPS = frozenset(op.split("::", 1)[1] for op in CPU_ALLOWED_OPS)

# Imported symbols (demangled) that reach the process, the machine or a library's kernels.
NATIVE_REACH = re.compile(r"""^(
    _?Py\w+ | PyObject\w* |                                   # the Python C API
    pybind11::module_::import | pybind11::detail::get_internals |
    dl\w+ | _dl_\w+ | __libc_dl\w+ | dl_iterate_phdr | getauxval |   # the dynamic linker
    cuGetProcAddress\w* | cudaGetDriverEntryPoint\w* | cuModule\w+ | cuLibrary\w+ |
    cudaLibrary\w+ | cuLaunch\w* | cudaGetFuncBySymbol | cuKernel\w+ |
    cudaIpc\w+ | cuIpc\w+ | cuMem(Export|Import)\w* |                 # other processes' memory
    cupti\w+ | cudaProfiler\w+ | cuProfiler\w+ | nvtx\w+ |
    (c10::|at::)?[\w:]*cublas\w* | [\w:]*cudnn\w* | cublas\w+ | cudnn\w+ |
    syscall | ptrace | process_vm_\w+ | fork | vfork | clone\d? | exec[lv]\w* | posix_spawn\w* |
    system | popen | kill | prctl | pthread_create | std::thread::_M_start_thread\w* |
    open | open64 | openat\w* | fopen\w* | freopen\w* | creat\w* | mmap\w* | mprotect |
    dup\d? | std::basic_[io]?fstream\w* | std::basic_filebuf[\w:<>, ]*::open\w* |
    c10::Dispatcher\b.* | c10::OperatorHandle\b.* | c10::impl::OperatorEntry\b.* |
    torch::Library\b.* | torch::jit::.* | torch::autograd::profiler::.* | torch::profiler::.* |
    libkineto::.* | at::native::.* | at::cuda::blas::.* | at::cpu::.* | at::meta::.*
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
    """Findings for every Python file of a submission, {relative path: text}. A file that does not
    parse is a finding too: what the grader cannot read, it cannot clear."""
    own = _own_modules(files)
    findings = []
    for name, text in files.items():
        if not name.endswith(".py"):
            continue
        try:
            tree = ast.parse(text, filename=name)
        except (SyntaxError, ValueError) as e:
            findings.append(ReachFinding(name, f"line {getattr(e, 'lineno', '?')}",
                                         "the grader cannot parse this file, so it cannot audit it"))
            continue
        findings += _Audit(name, own).run(tree)
    return findings


def _own_modules(files: dict[str, str]) -> set[str]:
    """Top-level modules a submission's folder provides and the grader read: x.py, x/__init__.py."""
    own = set()
    for name in files:
        parts = Path(name).parts
        if len(parts) == 1 and name.endswith(".py"):
            own.add(parts[0][:-3])
        elif len(parts) >= 2 and name.endswith(".py"):
            own.add(parts[0])
    return own


class _Audit(ast.NodeVisitor):
    def __init__(self, file: str, own: set[str]):
        self.file, self.own = file, own
        self.findings: list[ReachFinding] = []
        self.aliases: dict[str, str] = {}    # local name -> module path it stands for
        self.idiom: set[int] = set()         # ids of '__main__' constants in the main idiom

    def run(self, tree: ast.AST) -> list[ReachFinding]:
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) \
                    and node.left.id == "__name__":
                self.idiom |= {id(c) for c in node.comparators if isinstance(c, ast.Constant)}
        self.visit(tree)
        return self.findings

    def flag(self, node: ast.AST, what: str, why: str) -> None:
        self.findings.append(ReachFinding(f"{self.file} line {getattr(node, 'lineno', '?')}", what, why))

    def check_name(self, node: ast.AST, name: str, *, attribute_of: str | None = None) -> None:
        if name in REACH_NAMES:
            self.flag(node, name, "a way to the grader's objects, other processes or native code")
        elif _DUNDER.match(name) and name not in ALLOWED_DUNDERS:
            self.flag(node, name, "Python's internals: no kernel needs them")
        elif attribute_of is not None and name.startswith("_") and not _DUNDER.match(name) \
                and attribute_of not in ("self", "cls"):
            self.flag(node, f"{attribute_of}.{name}", "a private attribute of a library")

    def check_module(self, node: ast.AST, module: str, level: int = 0) -> None:
        if level:   # relative: a file of its own folder, read and audited with the rest
            return
        top = module.split(".")[0]
        if top not in ALLOWED_IMPORTS and top not in self.own:
            self.flag(node, f"import {module}", f"not a module a kernel needs (allowed: "
                      f"{', '.join(sorted(ALLOWED_IMPORTS - {'__future__'}))} and its own files)")
        for part in module.split(".")[1:]:
            self.check_name(node, part, attribute_of=top)

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
                self.aliases[alias.asname or alias.name] = f"{module}.{alias.name}"

    def visit_Name(self, node: ast.Name) -> None:
        self.check_name(node, node.id)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        base = node.value.id if isinstance(node.value, ast.Name) else None
        self.check_name(node, node.attr, attribute_of=base or "an object")
        path = self._path(node)
        if path in REACH_PATHS:
            self.flag(node, path, "runs code from a file or loads native code")
        self.generic_visit(node)

    def visit_keyword(self, node: ast.keyword) -> None:
        if node.arg:
            self.check_name(node, node.arg)
        self.generic_visit(node)

    def visit_FunctionDef(self, node) -> None:
        self.check_name(node, node.name)
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

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
        if not isinstance(node, ast.Name):
            return ""
        return ".".join([self.aliases.get(node.id, node.id)] + parts[::-1])


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
    """Findings for the imports of the object compiled from a submission's translation unit."""
    findings = []
    for symbol in undefined_symbols(obj):
        bare = re.sub(r"@.*$", "", symbol)            # versioned: open@GLIBC_2.2.5
        head = re.split(r"[(<]", bare, maxsplit=1)[0].strip()
        op = _ATEN_OP.match(bare)
        if op and not _data_op(op.group(1) + (op.group(2) or "")):
            findings.append(ReachFinding(obj.name, head, "a PyTorch operator that computes"))
        elif NATIVE_REACH.match(head):
            findings.append(ReachFinding(obj.name, head, _native_why(head)))
    return findings


def _data_op(name: str) -> bool:
    """at::_ops names carry the overload: empty_memory_format, transpose_int, to_dtype_layout."""
    parts = name.split("_")
    return any("_".join(parts[:i]) in DATA_OPS or "_" + "_".join(parts[1:i]) in DATA_OPS
               for i in range(1, len(parts) + 1))


def _native_why(symbol: str) -> str:
    if re.match(r"_?Py|pybind11", symbol):
        return "the Python C API: a way to the grader's objects"
    if re.search(r"cublas|cudnn|Dispatcher|OperatorHandle|OperatorEntry|at::|torch::jit|Library",
                 symbol, re.IGNORECASE):
        return "a library's kernels or PyTorch's dispatcher"
    if re.search(r"profiler|cupti|kineto|nvtx", symbol, re.IGNORECASE):
        return "the profiler"
    if re.match(r"dl|_dl|__libc_dl|getauxval|cu|cuda", symbol):
        return "loads or looks up code behind the grader's back"
    return "processes, threads, files or raw memory"


# ---------------------------------------------------------------- the verdict


def audit_sources(source: str) -> list[ReachFinding]:
    """python_reach of the Python files in read_sources' text."""
    from .submission import FILE_MARK
    files, name, lines = {}, None, []
    for line in source.split("\n"):
        if line.startswith(FILE_MARK):
            if name is not None:
                files[name] = "\n".join(lines)
            name, lines = line[1:], []
        else:
            lines.append(line)
    if name is not None:
        files[name] = "\n".join(lines)
    return python_reach(files)


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

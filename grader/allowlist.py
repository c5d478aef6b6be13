"""The Python audit: what a submission's .py files use, read by the grader before any of its code
runs, against the lists of grader/allowed.py (issue 30). Trusted side: nothing here imports,
loads or runs a submission; its files are parsed with `ast`.

Why. Which kernels a call ran is reported from inside the subject (grader/subject/loop.py), and
any code that runs there can rewrite that report. The first audit was a list of what is
forbidden, and a held-out round got past it: two ten-line files reached a public library API
that turns a string or a data file into running code, rewrote the subject's list of launched
kernels and ranked first at cuDNN's speed. A large library holds more such gadgets than any list
can name. So the audit accounts for everything a file uses, and what it cannot account for goes
to an instructor instead of the leaderboard.

Invariant. A Python submission ranks only if every .py file of its folder was read, is UTF-8 as
Python reads it, and every name it loads resolves, scope by scope as Python resolves it, to:
  - an import of a module on ALLOWED, followed by attribute paths ALLOWED or ALLOWED_PATHS name
    (a name rebound in a nearer scope, a parameter called `tl` say, is not the import);
  - a class or module of its own (never rebound), followed by what that class or module defines
    itself: functions, classes and literal constants (a class attribute that holds a library
    object is a value like any other);
  - a name it binds, or a builtin on ALLOWED_BUILTINS;
and every attribute of a value is on HOST_ATTRIBUTES (in a kernel's body, @triton.jit or
@T.prim_func, also KERNEL_ATTRIBUTES), every keyword argument is on ALLOWED_KEYWORDS or a
parameter of one of its own functions, no call spreads a dict of keywords, nothing assigns or
deletes an attribute, and no Triton kernel's source holds a second `def` line (Triton compiles a
kernel from its source text, found by the first or the last line that starts with `def`).
Anything else is a `review` finding: the submission is graded, but not ranked until an
instructor has looked (grader/review.py). The body of `if __name__ == "__main__":` never runs
when the grader imports the file (its name is "submission"; nothing may assign `__name__`): it
is read for known ways in only.

Known ways into the grader's process stay a cheat verdict, flagged before anything runs (`flag`
findings): a name on REACH_NAMES or REACH_PARTS (sys, gc, frames, eval, ctypes, the profiler,
...), a private attribute, a dunder outside ALLOWED_DUNDERS, a module used as a value, a path
through an allowed module to a module outside them, files that run code or are written for a
compiler's cache (REACH_PATHS, WRITE_PATHS), the grader's own package, a file of the folder named
like an installed module, a file the grader could not read, and TileLang's ways past its kernel.

A red team of session 19 found 13 submissions the first version of this audit passed (an allowed
Triton name that evaluates a string, own classes and modules standing for library objects, import
aliases rebound as parameters, a file named torch.py, a file mark inside a string, Triton's
source-text compile, compile options that load files, a library class patched through a local
name); each class is closed here and kept in tests/test_allowlist.py. What remains, and is said
in README: an attribute name on HOST_ATTRIBUTES that some allowed library object answers with a
gadget; the review queue (grader/review.py) and the trusted observations (grader/integrity.py)
are beneath the audit.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import functools
import importlib
import importlib.util
import os
import re
import sys
import types
from pathlib import Path

from .allowed import (ALLOWED, ALLOWED_BUILTINS, ALLOWED_DUNDERS, ALLOWED_KEYWORDS, ALLOWED_PATHS,
                      FAMILY, HOST_ATTRIBUTES, KERNEL_ATTRIBUTES, KERNEL_DECORATORS, MODULE_NAMES,
                      READABLE_CODECS, REACH_NAMES, REACH_PARTS, REACH_PATHS, TILELANG_API,
                      TILELANG_COMPILERS, TILELANG_KEYWORDS, TILELANG_LANGUAGE_MODULES,
                      TILELANG_PARTS, TILELANG_PREFIX, TILELANG_REACH, TILELANG_STRING,
                      TILELANG_WHY, WRITE_PATHS)
from .reach import ReachFinding
from .submission import FILE_MARK, split_sources

REVIEW_WHY = "not on the list of what a kernel wrapper needs (grader/allowed.py)"
_COOKIE = re.compile(r"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)", re.MULTILINE)
_DUNDER = re.compile(r"^__\w+__$")
_BUILTIN_NAMES = frozenset(dir(builtins))
# A replacement field of str.format that reads an attribute or an item ("{0.x}", "{a[b]}"):
# format strings are data that looks attributes up, out of the audit's sight.
_FORMAT_FIELD = re.compile(r"\{\s*\w*\s*(\.\s*[A-Za-z_]|\[)")
# A line Triton could take for a kernel's `def` (its interpreter: the last line whose text starts
# with "def "; its JIT: the first match of ^def\s+\w+\s*\( after dedenting the decorated source).
_DEF_LINE = re.compile(r"^\s*def\s")
# The libraries whose attribute paths the audit resolves in the grader's own import of them.
_ROOTS = frozenset(m.split(".")[0] for m in ALLOWED) - {"__future__", "tilelang"}
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


@dataclasses.dataclass(frozen=True)
class PythonAudit:
    """What the audit found in a submission's Python files: `flagged`, known ways into the
    grader's process (a cheat verdict before anything runs); `review`, what it cannot account
    for (graded, not ranked until an instructor clears it)."""
    flagged: tuple[ReachFinding, ...] = ()
    review: tuple[ReachFinding, ...] = ()


# ---------------------------------------------------------------- entry points


def audit_python(files: dict[str, str]) -> PythonAudit:
    """The audit of every Python file of a submission, {relative path: text}. A file Python would
    decode differently (a coding cookie) cannot be cleared; one that does not parse goes to
    review (importing it fails with the student's own SyntaxError at the build, which outranks
    review)."""
    own, shadowing = _own_modules(files)
    trees = _parsed(files)
    modules = [t for t in trees.values() if isinstance(t, ast.Module)]
    context = _Context(own=own, attributes=_own_attributes(files, trees),
                       params=frozenset(a.arg for t in modules for n in ast.walk(t)
                                        if isinstance(n, ast.arguments)
                                        for a in n.posonlyargs + n.args + n.kwonlyargs),
                       tilelang=any(re.search(r"\btilelang\b", text) for text in files.values()))
    flagged = [ReachFinding(name, name, "named like an installed module Python finds outside the "
                            "folder: which of the two an import loads depends on what was "
                            "imported first; rename it") for name in shadowing]
    review = []
    for name, tree in trees.items():
        if isinstance(tree, ReachFinding):
            flagged.append(tree)
        elif tree is None:
            review.append(ReachFinding(name, name, "does not parse as Python: the audit cannot "
                                       "read it"))
        else:
            audit = _Audit(name, files[name], context)
            try:
                audit.run(tree)
            except RecursionError:
                flagged.append(ReachFinding(name, name, "nested too deeply for the audit to read"))
                continue
            flagged += audit.flagged
            review += audit.review
    return PythonAudit(tuple(flagged), tuple(_unique(review)))


def audit_folder(source: str, folder: Path | None = None) -> PythonAudit:
    """audit_python of the Python files in read_sources' text; with the folder, also every .py
    there that read_sources did not read (too large, too many, a link, a hidden folder, a file
    holding read_sources' file mark): it could still be imported, and what was not read cannot
    be cleared."""
    files = split_sources(source)
    audit = audit_python(files)
    if folder is not None:
        audit = dataclasses.replace(audit, flagged=audit.flagged + tuple(_unread(Path(folder), set(files))))
    return audit


def python_kernel_names(files: dict[str, str]) -> set[str]:
    """The kernels a submission's Python defines (python_kernel_sites), by name."""
    return set(python_kernel_sites(files))


def python_kernel_sites(files: dict[str, str]) -> dict[str, str]:
    """{kernel name: 'file line N'} of the kernels a submission's Python defines, from its parsed
    files: each function under a decorator that resolves to triton.jit (with or without
    triton.autotune or heuristics above it) or passed to triton.jit, and for each function under
    TileLang's prim_func the kernel TileLang generates from it (`attention` ->
    `attention_kernel`). A plain function, a comment or a string names no kernel."""
    sites: dict[str, str] = {}
    files = {(name or "submission.py"): text for name, text in files.items()}
    for name, tree in _parsed(files).items():
        if not isinstance(tree, ast.Module):
            continue
        aliases = _aliases(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                kind = _kernel_kind(node, aliases)
                if kind:
                    kernel = node.name if kind == "triton.jit" else f"{node.name}_kernel"
                    sites.setdefault(kernel, f"{name} line {node.lineno}")
            elif isinstance(node, ast.Call) and _dotted(node.func, aliases) in KERNEL_DECORATORS \
                    and node.args and isinstance(node.args[0], ast.Name):
                path, fn = _dotted(node.func, aliases), node.args[0].id
                sites.setdefault(fn if path == "triton.jit" else f"{fn}_kernel",
                                 f"{name} line {node.lineno}")
    return sites


def describe(findings, limit: int = 8) -> list[str]:
    """'file line N: what (why)' for each finding, at most `limit`, then how many more."""
    lines = [f.describe() for f in findings[:limit]]
    if len(findings) > limit:
        lines.append(f"... and {len(findings) - limit} more")
    return lines


# ---------------------------------------------------------------- the files


def _parsed(files: dict[str, str]) -> dict[str, "ast.Module | ReachFinding | None"]:
    """Each .py file's syntax tree; a ReachFinding for a file Python would read differently; None
    for one that does not parse."""
    trees = {}
    for name, text in files.items():
        if not name.endswith(".py"):
            continue
        cookie = _COOKIE.search("\n".join(text.split("\n")[:2]))
        if (cookie and cookie.group(1).lower() not in READABLE_CODECS) or "\ufffd" in text:
            trees[name] = ReachFinding(name, cookie.group(0).strip() if cookie else "U+FFFD",
                                       "Python would read this file differently from the audit: "
                                       "save it as UTF-8")
            continue
        try:   # Python drops a UTF-8 byte order mark before it parses; so does the audit
            trees[name] = ast.parse(text.removeprefix("\ufeff"), filename=name)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            trees[name] = None
    return trees


def _own_modules(files: dict[str, str]) -> tuple[set[str], list[str]]:
    """Top-level modules a submission's folder provides and the grader read (x.py, x/...py), and
    the files named like a module Python finds elsewhere (a gc.py or a torch.py beside the
    submission: which one loads depends on what was imported first). find_spec locates, never
    imports."""
    own, shadowing = set(), []
    for name in files:
        parts = Path(name).parts
        if not name.endswith(".py"):
            continue
        top = parts[0][:-3] if len(parts) == 1 else parts[0]
        if top in own or top in ("submission",):
            own.add(top)
            continue
        if top in REACH_NAMES or _installed(top):
            shadowing.append(name)
        else:
            own.add(top)
    return own, shadowing


@functools.lru_cache(maxsize=1024)
def _installed(module: str) -> bool:
    """Whether Python finds a top-level module of this name outside the submission's folder (the
    grader's own import path, which is the subject's but for the folder)."""
    if module in sys.builtin_module_names or module in getattr(sys, "stdlib_module_names", ()):
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return True   # a name Python's own machinery chokes on is no module of the submission's


def _own_attributes(files: dict[str, str], trees: dict) -> dict[str, frozenset[str]]:
    """What each of the submission's own modules ('module:x', 'module:pkg.sub') and classes
    ('class:Name') defines itself: functions, classes and names only ever assigned literal
    constants (never a value that could be a library object), and a package's submodules. A class
    name defined twice gets nothing: which one a name stands for is not known."""
    attributes: dict[str, set[str]] = {}
    classes_seen: dict[str, int] = {}
    for name, tree in trees.items():
        if not isinstance(tree, ast.Module):
            continue
        module = name[:-3].replace("/", ".").removesuffix(".__init__")
        attributes.setdefault(f"module:{module}", set()).update(_defined_here(tree.body))
        parent, _, child = module.rpartition(".")
        if parent:
            attributes.setdefault(f"module:{parent}", set()).add(child)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes_seen[node.name] = classes_seen.get(node.name, 0) + 1
                attributes.setdefault(f"class:{node.name}", set()).update(_defined_here(node.body))
    for cls, count in classes_seen.items():
        if count > 1:
            attributes[f"class:{cls}"] = set()
    return {k: frozenset(v) for k, v in attributes.items()}


def _defined_here(body: list[ast.stmt]) -> set[str]:
    """Functions, classes and names assigned only literal constants, at one body's top level."""
    defined, other = set(), set()
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(stmt.name)
            continue
        targets = stmt.targets if isinstance(stmt, ast.Assign) else \
            [stmt.target] if isinstance(stmt, (ast.AnnAssign, ast.AugAssign)) else []
        value = getattr(stmt, "value", None)
        for target in targets:
            names = {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
            (defined if isinstance(target, ast.Name) and _literal(value) else other).update(names)
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            other |= {a.asname or a.name.split(".")[0] for a in stmt.names}
    return defined - other


def _literal(node: ast.AST | None) -> bool:
    """A constant, or containers and arithmetic of constants: a value that cannot be a library
    object."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(_literal(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(k is not None and _literal(k) for k in node.keys) and all(_literal(v) for v in node.values)
    if isinstance(node, ast.UnaryOp):
        return _literal(node.operand)
    if isinstance(node, ast.BinOp):
        return _literal(node.left) and _literal(node.right)
    return False


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
                                             "read (too large, too many, a link, hidden, or "
                                             f"holding the byte {FILE_MARK!r}): it could still be "
                                             "imported; remove it"))
    return findings


def _unique(findings: list[ReachFinding]) -> list[ReachFinding]:
    """One finding per (where, what): a name used twice on a line is one finding."""
    return list({(f.where, f.what): f for f in findings}.values())


# ---------------------------------------------------------------- paths through the allowed modules


@functools.lru_cache(maxsize=None)
def _module(path: str):
    """The module at `path` in the grader's own import of an allowed library (trusted code,
    imported here without touching the GPU); None when it is not installed here."""
    try:
        return importlib.import_module(path)
    except Exception:   # not installed here, or broken
        return None


@functools.lru_cache(maxsize=4096)
def _resolve(path: str):
    """What an attribute path names in the grader's own import of the library, or None when it
    cannot be resolved here. Only the libraries of _ROOTS are imported: never a module a
    submission merely names."""
    parts = path.split(".")
    if parts[0] not in _ROOTS:
        return None
    obj = _module(parts[0])
    try:
        for part in parts[1:]:
            obj = getattr(obj, part)
    except Exception:
        return None
    return obj


def _is_module_path(path: str) -> bool:
    return path in ALLOWED or isinstance(_resolve(path), types.ModuleType)


def allowed_path(path: str) -> bool:
    """Whether an attribute path through the allowed modules is on the lists: an allowed module,
    a name ALLOWED lists under its module, an exact path of ALLOWED_PATHS, or a public attribute,
    not a module, of a FAMILY namespace that this machine's import of the library has."""
    if path in ALLOWED or path in ALLOWED_PATHS:
        return True
    module, _, name = path.rpartition(".")
    if module not in ALLOWED:
        return False
    names = ALLOWED[module]
    if names is not FAMILY:
        return name in names
    found = None if name.startswith("_") else _resolve(path)
    return found is not None and not isinstance(found, types.ModuleType)


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Local names a file's imports bind, each to the dotted path it stands for (for naming
    kernels: the audit itself resolves names scope by scope)."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name.split(".")[0]] = \
                    alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            for alias in node.names:
                if alias.name != "*":
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return aliases


def _dotted(node: ast.AST, aliases) -> str:
    """The dotted path an expression names through imports (`tl.math.exp2` ->
    'triton.language.math.exp2'; a call of a decorator factory, `triton.autotune(...)`, is the
    factory's path); '' when it is not rooted in an import. `aliases`: a dict, or a function of
    a name."""
    if isinstance(node, ast.Call):
        node = node.func
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    root = None
    if isinstance(node, ast.Name):
        root = aliases(node.id) if callable(aliases) else aliases.get(node.id)
    return ".".join([root] + parts[::-1]) if root else ""


def _kernel_kind(node: ast.FunctionDef, aliases) -> str:
    """'triton.jit' or 'tilelang.language.prim_func' when a decorator makes `node` a kernel."""
    for decorator in node.decorator_list:
        path = _dotted(decorator, aliases)
        if path in KERNEL_DECORATORS:
            return path
    return ""


# ---------------------------------------------------------------- scopes


def _bindings(scope: ast.AST) -> dict[str, set[str]]:
    """What each name is bound to in one scope (a module, function, lambda or class body), as
    Python binds it there: 'param', 'def', 'class', 'assign', 'del', 'global', 'import:<path>'
    (a library's module or name) or 'own:<module>' (a file of the folder); nested functions,
    lambdas and classes are scopes of their own (their names and decorators belong here)."""
    found: dict[str, set[str]] = {}

    def bind(name: str, kind: str) -> None:
        found.setdefault(name, set()).add(kind)

    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        a = scope.args
        for arg in a.posonlyargs + a.args + a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x]:
            bind(arg.arg, "param")
        body = [scope.body] if isinstance(scope, ast.Lambda) else scope.body
    else:
        body = scope.body
    stack = list(body) if isinstance(body, list) else [body]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bind(node.name, "class" if isinstance(node, ast.ClassDef) else "def")
            stack += node.decorator_list
            if isinstance(node, ast.ClassDef):
                stack += node.bases + [k.value for k in node.keywords]
            else:
                stack += node.args.defaults + [d for d in node.args.kw_defaults if d]
            continue
        if isinstance(node, ast.Lambda):
            stack += node.args.defaults + [d for d in node.args.kw_defaults if d]
            continue
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Store):
                bind(node.id, "assign")
            elif isinstance(node.ctx, ast.Del):
                bind(node.id, "del")
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bind(node.name, "assign")
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            bind(node.name, "assign")
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bind(node.rest, "assign")
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            for name in node.names:
                bind(name, "global")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name.split(".")[0]
                bind(local, f"import:{alias.name if alias.asname else local}")
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name != "*":
                    bind(alias.asname or alias.name,
                         f"import:{'.' * node.level}{node.module or ''}.{alias.name}")
        stack += list(ast.iter_child_nodes(node))
    return found


@dataclasses.dataclass(frozen=True)
class _Context:
    """What every file's audit shares: the folder's own modules, what its modules and classes
    define, every parameter name of its functions, and whether it uses TileLang."""
    own: set[str]
    attributes: dict[str, frozenset[str]]
    params: frozenset[str]
    tilelang: bool


# ---------------------------------------------------------------- one file


class _Audit(ast.NodeVisitor):
    def __init__(self, file: str, text: str, context: _Context):
        self.file, self.context = file, context
        self.lines = text.removeprefix("\ufeff").split("\n")
        self.flagged: list[ReachFinding] = []
        self.review: list[ReachFinding] = []
        self.scopes: list[tuple[ast.AST, dict[str, set[str]]]] = []
        self.idiom: set[int] = set()         # ids of '__main__' constants in the main idiom
        self.bases: set[int] = set()         # ids of nodes that are the base of an attribute
        self.called: set[int] = set()        # ids of nodes called, or used as a decorator
        self.kernel_depth = 0                # > 0 inside a kernel's body
        self.in_main = False                 # inside `if __name__ == "__main__":`
        self.rebound: set[str] = set()       # imported names already reported as rebound

    def run(self, tree: ast.Module) -> None:
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
        self.scopes.append((tree, _bindings(tree)))
        self.visit(tree)

    # -- findings

    def flag(self, node: ast.AST, what: str, why: str) -> None:
        self.flagged.append(ReachFinding(self.where(node), what, why))

    def to_review(self, node: ast.AST, what: str, why: str = REVIEW_WHY) -> None:
        if not self.in_main:   # never runs when the grader imports the file
            self.review.append(ReachFinding(self.where(node), what, why))

    def where(self, node: ast.AST) -> str:
        return f"{self.file} line {getattr(node, 'lineno', '?')}"

    # -- what a name stands for, scope by scope

    def lookup(self, name: str) -> set[str] | None:
        """The kinds of binding of `name` in the nearest scope that binds it (a class body is
        seen only from directly inside it), or None: a global Python finds in builtins."""
        for k, (node, bound) in enumerate(reversed(self.scopes)):
            if isinstance(node, ast.ClassDef) and k > 0:
                continue
            if name in bound and not bound[name] <= {"global"}:
                return bound[name]
        return None

    def meaning(self, node: ast.AST, name: str) -> tuple[str, str]:
        """('import', path), ('own', module), ('class', name), ('value', '') or ('builtin', '')
        for a name loaded at `node`. An imported name also bound otherwise in its scope is a
        value, and reviewed once: the import is not what it stands for everywhere."""
        kinds = self.lookup(name)
        if kinds is None:
            return ("builtin", "")
        imports = {k.split(":", 1)[1] for k in kinds if k.startswith("import:")}
        if imports and (len(imports) > 1 or len(kinds) > 1):
            if name not in self.rebound:
                self.rebound.add(name)
                self.to_review(node, name, "an imported name bound again in the same scope (a "
                               "parameter, an assignment or a second import): the audit cannot "
                               "tell which it stands for")
            return ("value", "")
        if imports:
            path = imports.pop()
            top = path.lstrip(".").split(".")[0]
            if path.startswith(".") or top in self.context.own:
                return ("own", path.lstrip("."))
            return ("import", path)
        if kinds == {"class"}:
            return ("class", name)
        return ("value", "")

    # -- the denylist: known ways in (flagged)

    def check_name(self, node: ast.AST, name: str, *, attribute_of: str | None = None) -> bool:
        """Flags a name that is a known way in; True when it did (or reviewed: a private
        attribute of the submission's own `self` or `cls`)."""
        before = len(self.flagged) + len(self.review)
        if name in REACH_NAMES or REACH_PARTS.search(name):
            self.flag(node, name, "a way to the grader's objects, other processes or native code")
        elif _DUNDER.match(name) and name not in ALLOWED_DUNDERS:
            self.flag(node, name, "Python's internals: no kernel needs them")
        elif attribute_of is not None and name.startswith("_") and not _DUNDER.match(name):
            if attribute_of in ("self", "cls"):
                self.to_review(node, f"{attribute_of}.{name}", "an attribute of an object of "
                               "the submission's own: " + REVIEW_WHY)
            else:
                self.flag(node, f"{attribute_of}.{name}", "a private attribute: no kernel needs it")
        elif self.context.tilelang and (name in TILELANG_REACH or TILELANG_PREFIX.match(name)
                                        or TILELANG_PARTS.search(name)):
            self.flag(node, name, TILELANG_WHY)
        return len(self.flagged) + len(self.review) > before

    def check_path(self, node: ast.AST, path: str) -> None:
        """A path through allowed modules may not arrive at a module outside them (`enum.bltns`
        is builtins), nor at something that runs or writes a file (REACH_PATHS, WRITE_PATHS)."""
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
        found = _resolve(path)
        if isinstance(found, types.ModuleType) and found.__name__.split(".")[0] not in _ROOTS:
            self.flag(node, path, f"is the module {found.__name__}, reached through another module")

    def check_compiler_use(self, node: ast.AST, path: str | None) -> None:
        """TileLang's compiler may be called or be a decorator, not be a value: a value can be
        called later with the positional options visit_Call rules out."""
        if self.context.tilelang and path in TILELANG_COMPILERS and id(node) not in self.called:
            self.flag(node, path, "TileLang's compiler used as a value: call it (or decorate with "
                      "it) where it is named, with the kernel alone and keywords")

    # -- the allowlist (review)

    def account_path(self, node: ast.AST, path: str, attributes: list[str]) -> None:
        """An attribute chain rooted in an import (`path`: what the root name stands for; then
        `attributes`): its longest allowed prefix, which must not stop at a module (a module's
        name that is not on the list), then attributes of the value that prefix gives."""
        full = path.split(".") + attributes
        k = next((k for k in range(len(full), 0, -1) if allowed_path(".".join(full[:k]))), 0)
        if k == 0 or (k < len(full) and _is_module_path(".".join(full[:k]))):
            self.to_review(node, ".".join(full), f"{'.'.join(full[:k + 1])} is {REVIEW_WHY}")
        else:
            self.account_attributes(node, ".".join(full[:k]), full[k:])

    def account_attributes(self, node: ast.AST, base: str, attributes: list[str]) -> None:
        allowed = KERNEL_ATTRIBUTES if self.kernel_depth else HOST_ATTRIBUTES
        for name in attributes:
            if name not in allowed and not self.check_name(node, name, attribute_of=base):
                self.to_review(node, f"{base}.{name}", "an attribute of a value that is not on "
                               "the list of what a kernel wrapper needs (grader/allowed.py)")
                return
            base = f"{base}.{name}"

    def account_own(self, node: ast.AST, key: str, base: str, attributes: list[str]) -> None:
        """A chain rooted in the submission's own module or class: names it defines itself
        (module:x, class:Name in _own_attributes), through its submodules and classes, then
        attributes of a value."""
        for k, name in enumerate(attributes):
            if not key:   # past a function or constant of its own: a value's attributes
                self.account_attributes(node, base, attributes[k:])
                return
            if name not in self.context.attributes.get(key, frozenset()):
                self.check_name(node, name, attribute_of=base) or self.to_review(
                    node, f"{base}.{name}", "not a function, class or literal constant that the "
                    "submission's own module or class defines itself (an imported name or an "
                    "assigned value may be a library's object)")
                return
            base = f"{base}.{name}"
            module = key.removeprefix("module:")
            if key.startswith("module:") and f"module:{module}.{name}" in self.context.attributes:
                key = f"module:{module}.{name}"
            elif f"class:{name}" in self.context.attributes:
                key = f"class:{name}"
            else:
                key = ""

    # -- imports

    def check_module(self, node: ast.AST, module: str, level: int = 0, *, names=()) -> None:
        """An import of `module` (or, with `names`, of those names from it)."""
        if level:   # relative: a file of its own folder, read and audited with the rest
            return
        top = module.split(".")[0]
        for part in module.split("."):
            if self.check_name(node, part, attribute_of=top):
                return
        if top in self.context.own:
            return
        if top == "grader":   # the grader's own package, beside the subject's loop
            self.flag(node, f"import {module}", "the grader's own modules: a way to its objects")
            return
        self.check_path(node, module)
        if names and all(allowed_path(f"{module}.{n}") for n in names):
            return
        if not allowed_path(module):
            self.to_review(node, f"import {module}", f"not a module a kernel wrapper needs (allowed: "
                           f"{', '.join(sorted(m for m in ALLOWED if '.' not in m and m != '__future__'))}"
                           f", their parts on the list, and the folder's own files)")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.check_module(node, alias.name)
            if alias.asname:
                self.check_name(node, alias.asname)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        own = bool(node.level) or module.split(".")[0] in self.context.own
        names = [a.name for a in node.names if a.name != "*"]
        if module:
            self.check_module(node, module, node.level, names=names)
        for alias in node.names:
            if alias.name == "*":
                self.flag(node, f"from {module} import *", "hides which names the file uses")
                continue
            flagged = self.check_name(node, alias.name, attribute_of=module or ".")
            if module and not own:
                self.check_path(node, f"{module}.{alias.name}")
            if flagged:
                continue
            if alias.asname:
                self.check_name(node, alias.asname)
            if not own and not allowed_path(f"{module}.{alias.name}") and allowed_path(module):
                self.to_review(node, f"from {module} import {alias.name}")

    # -- names and attributes

    def visit_Name(self, node: ast.Name) -> None:
        if self.check_name(node, node.id):
            return
        if not isinstance(node.ctx, ast.Load):
            if node.id == "__name__":
                self.flag(node, "__name__", "assigns the module's name: the grader relies on it")
            return
        kind, path = self.meaning(node, node.id)
        self.check_compiler_use(node, path if kind == "import" else None)
        if kind == "import":
            if id(node) not in self.bases and isinstance(_resolve(path), types.ModuleType):
                self.flag(node, node.id, "a module used as a value (only module.attribute is allowed)")
            elif id(node) not in self.bases:
                self.check_path(node, path)
                self.account_path(node, path, [])
        elif kind == "builtin" and node.id not in MODULE_NAMES:
            if node.id in _BUILTIN_NAMES:
                if node.id not in ALLOWED_BUILTINS:
                    self.to_review(node, node.id, "a builtin that is not on the list of what a "
                                   "kernel wrapper needs (grader/allowed.py)")
            else:
                self.to_review(node, node.id, "a name the file never defines")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if id(node) in self.bases:   # the inner part of a longer chain: its outermost node decides
            self.generic_visit(node)
            return
        root, attributes = node, []
        while isinstance(root, ast.Attribute):
            attributes.append(root.attr)
            root = root.value
        attributes.reverse()
        kind, path = self.meaning(root, root.id) if isinstance(root, ast.Name) else ("value", "")
        base = root.id if isinstance(root, ast.Name) else _short(root)
        for k, name in enumerate(attributes):
            prefix = ".".join([path] + attributes[:k + 1]) if kind == "import" else ""
            if prefix == "tilelang.compile":   # TileLang's compiler, not the builtin
                continue
            flagged = self.check_name(node, name, attribute_of=base if k == 0 else "an object")
            if prefix:
                self.check_path(node, prefix)
            if flagged:   # a known way in: the cheat verdict; nothing more to account for
                self.generic_visit(node)
                return
        full = ".".join([base] + attributes)
        if not isinstance(node.ctx, ast.Load):
            self.to_review(node, full, "assigns or deletes an attribute: it changes an object "
                           "that may be a library's, and no kernel wrapper needs to")
        elif kind == "import":
            full = ".".join([path] + attributes)
            self.check_compiler_use(node, full)
            if isinstance(_resolve(full), types.ModuleType) and id(node) not in self.called:
                self.flag(node, full, "a module used as a value (only module.attribute is allowed)")
            else:
                self.account_path(node, path, attributes)
        elif kind == "own":
            self.account_own(node, f"module:{path}", base, attributes)
        elif kind == "class":
            self.account_own(node, f"class:{path}", base, attributes)
        elif isinstance(root, ast.Constant) and isinstance(root.value, str) \
                and attributes == ["format"] and not _FORMAT_FIELD.search(root.value):
            pass   # "...{}...".format(x): a format string that reads no attribute
        else:
            self.account_attributes(node, base, attributes)
        self.generic_visit(node)

    def visit_keyword(self, node: ast.keyword) -> None:
        if node.arg:
            if not self.check_name(node, node.arg) and node.arg not in ALLOWED_KEYWORDS \
                    and node.arg not in self.context.params:
                self.to_review(node, f"{node.arg}=", "a keyword argument that is not on the list "
                               "of what a kernel wrapper passes (grader/allowed.py) nor a "
                               "parameter of the submission's own functions")
            if self.context.tilelang and node.arg in TILELANG_KEYWORDS - TILELANG_REACH:
                self.flag(node, f"{node.arg}=", TILELANG_WHY)
        elif self.context.tilelang:
            self.flag(node, "**", "keywords spread from a dict: with TileLang, every keyword must "
                      "be written out (compile_flags, target, ... are ways past the kernel)")
        else:
            self.to_review(node, "**", "keywords spread from a dict: the audit cannot see which "
                           "keywords a call gets")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        path = _dotted(func, self.import_path) if isinstance(func, (ast.Attribute, ast.Name)) else ""
        if self.context.tilelang and path in TILELANG_COMPILERS and (
                len(node.args) > 1 or any(isinstance(a, ast.Starred) for a in node.args)):
            self.flag(node, f"{path}(...)", "TileLang's compiler takes the kernel alone: its "
                      "positional options are the target, the execution backend, pass configs "
                      "and compiler flags (write out_idx= as a keyword)")
        if path in ("triton.Config", "triton.heuristics"):
            self.check_triton_options(node, path)
        self.generic_visit(node)

    def check_triton_options(self, node: ast.Call, path: str) -> None:
        """A Config's or heuristics' dict becomes keywords of the kernel's launch, where Triton
        also reads compile options (extern_libs, ptx_options, ir_override, ...): its keys are
        written out and pass the keyword rule; a Config takes at most its first four arguments
        by position (kwargs, num_warps, num_stages, num_ctas; then come maxnreg, pre_hook and
        ir_override)."""
        if path == "triton.Config" and len(node.args) > 4 or \
                any(isinstance(a, ast.Starred) for a in node.args):
            self.to_review(node, f"{path}(...)", "more than kwargs, num_warps, num_stages and "
                           "num_ctas by position: write the rest as keywords")
        first = node.args[0] if node.args else None
        if first is None:
            return
        if not isinstance(first, ast.Dict) or any(
                not (isinstance(k, ast.Constant) and isinstance(k.value, str)) for k in first.keys):
            self.to_review(node, f"{path}(...)", "its dict of kernel arguments must be written "
                           "out, with string keys: they become keywords of the kernel's launch")
            return
        for key in first.keys:
            if key.value not in ALLOWED_KEYWORDS and key.value not in self.context.params:
                self.to_review(key, repr(key.value), "a key that becomes a keyword of the "
                               "kernel's launch and is none of its parameters: " + REVIEW_WHY)

    def import_path(self, name: str) -> str | None:
        """The import a name stands for here, for _dotted (None for anything else)."""
        kinds = self.lookup(name) or set()
        imports = [k.split(":", 1)[1] for k in kinds if k.startswith("import:")]
        return imports[0] if len(imports) == 1 and len(kinds) == 1 else None

    def visit_MatchClass(self, node: ast.MatchClass) -> None:   # case C(attr=...) reads attr
        for name in node.kwd_attrs:
            if not self.check_name(node, name, attribute_of="an object"):
                self.account_attributes(node, "a matched object", [name])
        self.generic_visit(node)

    def visit_If(self, node: ast.If) -> None:
        if self.scopes and len(self.scopes) == 1 and _main_idiom(node.test) and not self.in_main:
            self.visit(node.test)
            self.in_main = True
            for stmt in node.body:
                self.visit(stmt)
            self.in_main = False
            for stmt in node.orelse:
                self.visit(stmt)
            return
        self.generic_visit(node)

    def visit_FunctionDef(self, node) -> None:
        self.check_name(node, node.name)
        arguments = node.args
        for arg in arguments.posonlyargs + arguments.args + arguments.kwonlyargs \
                + [a for a in (arguments.vararg, arguments.kwarg) if a]:
            self.annotation(arg.annotation)
            if arg.annotation is not None:
                self.visit(arg.annotation)
        for default in arguments.defaults + [d for d in arguments.kw_defaults if d]:
            self.visit(default)
        self.annotation(node.returns)
        for decorator in node.decorator_list:
            self.visit(decorator)
        if node.returns is not None:
            self.visit(node.returns)
        kind = _kernel_kind(node, self.import_path)
        if kind == "triton.jit":
            self.check_kernel_source(node)
        self.scopes.append((node, _bindings(node)))
        self.kernel_depth += bool(kind)
        for stmt in node.body:
            self.visit(stmt)
        self.kernel_depth -= bool(kind)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def check_kernel_source(self, node: ast.FunctionDef) -> None:
        """Triton compiles a kernel from its source text, from a line that starts with `def`: the
        first one of the decorated source (its JIT) or the last one (its interpreter). Any such
        line but the kernel's own, in a string, a decorator or a comment, is what would run."""
        first = min([d.lineno for d in node.decorator_list] + [node.lineno])
        for number in range(first, (node.end_lineno or node.lineno) + 1):
            if number != node.lineno and _DEF_LINE.match(self.lines[number - 1]):
                self.flag(node, f"line {number}: {self.lines[number - 1].strip()[:60]}",
                          "a second `def` line in a Triton kernel's source (in a string, a "
                          "decorator or a comment): Triton compiles the kernel from its source "
                          "text, and could compile that line, which the audit does not read as "
                          "code")

    def visit_Lambda(self, node: ast.Lambda) -> None:
        for default in node.args.defaults + [d for d in node.args.kw_defaults if d]:
            self.visit(default)
        self.scopes.append((node, _bindings(node)))
        self.visit(node.body)
        self.scopes.pop()

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
            inner = _Audit(f"{self.file} line {node.lineno}, annotation", "", self.context)
            inner.scopes = list(self.scopes)
            inner.kernel_depth, inner.in_main = self.kernel_depth, self.in_main
            inner.bases = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
            inner.visit(tree)
            self.flagged += inner.flagged
            self.review += inner.review

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.check_name(node, node.name)
        for keyword in node.keywords:
            self.to_review(node, f"class {node.name}({keyword.arg}=...)", "a metaclass or class "
                           "keyword: no kernel wrapper needs one")
        for base in node.bases:
            kind, _ = self.meaning(base, base.id) if isinstance(base, ast.Name) else ("value", "")
            if not (kind == "class" or (kind == "builtin" and base.id in ALLOWED_BUILTINS)):
                self.to_review(node, f"class {node.name}({ast.unparse(base)[:60]})",
                               "a class built on a library's class: no kernel wrapper needs one")
        for item in node.decorator_list + node.bases:
            self.visit(item)
        self.scopes.append((node, _bindings(node)))
        for stmt in node.body:
            self.visit(stmt)
        self.scopes.pop()

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and id(node) not in self.idiom and (
                node.value in REACH_NAMES or
                (_DUNDER.match(node.value) and node.value not in ALLOWED_DUNDERS) or
                (self.context.tilelang and (node.value in TILELANG_KEYWORDS
                                            or TILELANG_STRING.search(node.value)
                                            or (" " not in node.value and TILELANG_PARTS.search(node.value))))):
            self.flag(node, repr(node.value)[:60], "a string naming a way in")


def _main_idiom(test: ast.AST) -> bool:
    """`__name__ == "__main__"` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides) and \
        any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides)


def _short(node: ast.AST, limit: int = 40) -> str:
    """An expression as the student wrote it, cut short: what a finding's attribute is read on."""
    text = ast.unparse(node)
    return text if len(text) <= limit else text[:limit - 3] + "..."

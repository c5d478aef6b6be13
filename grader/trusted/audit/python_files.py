"""The submission's Python files as the audit reads them: each file parsed (or why it cannot be:
an encoding Python would read differently, a syntax error), the folder's own modules and the
files named like an installed module, what its own modules and classes define themselves, and
the .py files of the folder that read_sources did not read."""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import os
import re
import sys
from pathlib import Path

from grader.course.submission import FILE_MARK
from grader.trusted.audit.allowed import REACH_NAMES, READABLE_CODECS
from grader.trusted.audit.findings import ReachFinding


_COOKIE = re.compile(r"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)", re.MULTILINE)


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

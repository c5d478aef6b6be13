"""Paths through the allowed modules: what a dotted path names in the grader's own import of an
allowed library (_resolve, importing only the libraries of _ROOTS), whether it is on the lists
of allowed.py (allowed_path), and the dotted path an expression names through a file's imports
(_aliases, _dotted)."""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import types

from grader.trusted.audit.allowed import ALLOWED, ALLOWED_PATHS, FAMILY


# The libraries whose attribute paths the audit resolves in the grader's own import of them.
_ROOTS = frozenset(m.split(".")[0] for m in ALLOWED) - {"__future__", "tilelang"}


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

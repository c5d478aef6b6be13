"""What a kernel is in a submission's Python: a function under triton.jit (with or without
autotune or heuristics above it) or passed to it, and the kernel TileLang generates from a
prim_func (`attention` -> `attention_kernel`); by name and by the line that defines it, for
integrity and identity. The audit itself asks _kernel_kind which functions are kernels."""

from __future__ import annotations

import ast

from grader.trusted.audit.allowed import KERNEL_DECORATORS
from grader.trusted.audit.paths import _aliases, _dotted
from grader.trusted.audit.python_files import _parsed


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


def _kernel_kind(node: ast.FunctionDef, aliases) -> str:
    """'triton.jit' or 'tilelang.language.prim_func' when a decorator makes `node` a kernel."""
    for decorator in node.decorator_list:
        path = _dotted(decorator, aliases)
        if path in KERNEL_DECORATORS:
            return path
    return ""

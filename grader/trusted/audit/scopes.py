"""Scopes, as Python binds names in them: what each name of a module, function, lambda or class
body is bound to (_bindings), and the _Context every file's audit shares (the folder's own
modules, what they define, its functions' parameter names, whether it uses TileLang)."""

from __future__ import annotations

import ast
import dataclasses


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


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

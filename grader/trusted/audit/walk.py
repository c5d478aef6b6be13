"""The walk of one Python file (_Audit): a NodeVisitor that visits every name, attribute,
keyword, call, import, definition and string of the file, scope by scope, and puts each
through the checks of rules.py; a string annotation is walked as the code it is."""

from __future__ import annotations

import ast
import builtins
import re
import types

from grader.trusted.audit.allowed import (ALLOWED_BUILTINS, ALLOWED_DUNDERS, ALLOWED_KEYWORDS,
                                          MODULE_NAMES, REACH_NAMES, TILELANG_COMPILERS,
                                          TILELANG_KEYWORDS, TILELANG_PARTS, TILELANG_REACH,
                                          TILELANG_STRING, TILELANG_WHY)
from grader.trusted.audit.paths import _resolve, allowed_path, _dotted
from grader.trusted.audit.python_kernels import _kernel_kind
from grader.trusted.audit.scopes import _bindings
from grader.trusted.audit.rules import _DUNDER, _Rules


_BUILTIN_NAMES = frozenset(dir(builtins))


# A replacement field of str.format that reads an attribute or an item ("{0.x}", "{a[b]}"):
# format strings are data that looks attributes up, out of the audit's sight.
_FORMAT_FIELD = re.compile(r"\{\s*\w*\s*(\.\s*[A-Za-z_]|\[)")


class _Audit(_Rules):
    """The walk of one file's syntax tree, node by node, scope by scope: each name, attribute,
    keyword, call, import and definition, through the checks of rules._Rules."""

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

    # -- imports

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
                                   "kernel wrapper needs (grader/trusted/audit/allowed.py)")
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
                               "of what a kernel wrapper passes (grader/trusted/audit/allowed.py) nor a "
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

    def visit_MatchClass(self, node: ast.MatchClass) -> None:   # case C(attr=...) reads attr
        for name in node.kwd_attrs:
            if not self.check_name(node, name, attribute_of="an object"):
                self.account_attributes(node, "a matched object", [name])
        self.generic_visit(node)

    # -- statements and scopes

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

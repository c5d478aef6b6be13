"""What one file's audit concludes about a name, an attribute path or an import: what a name
stands for in the scopes around it (an import, a module or class of the submission's own, a
value, a builtin), the known ways in that are flagged (the denylist), what the lists account
for and what goes to review (the allowlist), and Triton's options and source text. The walk
that calls these checks node by node is walk.py's."""

from __future__ import annotations

import ast
import re
import types

from grader.trusted.audit.allowed import (ALLOWED, ALLOWED_DUNDERS, ALLOWED_KEYWORDS,
                                          HOST_ATTRIBUTES, KERNEL_ATTRIBUTES, REACH_NAMES,
                                          REACH_PARTS, REACH_PATHS, TILELANG_API,
                                          TILELANG_COMPILERS, TILELANG_LANGUAGE_MODULES,
                                          TILELANG_PARTS, TILELANG_PREFIX, TILELANG_REACH,
                                          TILELANG_WHY, WRITE_PATHS)
from grader.trusted.audit.findings import ReachFinding
from grader.trusted.audit.paths import _ROOTS, _resolve, _is_module_path, allowed_path
from grader.trusted.audit.scopes import _Context


REVIEW_WHY = "not on the list of what a kernel wrapper needs (grader/trusted/audit/allowed.py)"

_DUNDER = re.compile(r"^__\w+__$")

# A line Triton could take for a kernel's `def` (its interpreter: the last line whose text starts
# with "def "; its JIT: the first match of ^def\s+\w+\s*\( after dedenting the decorated source).
_DEF_LINE = re.compile(r"^\s*def\s")


class _Rules(ast.NodeVisitor):
    """One file's audit, but for the walk (walk._Audit): its findings, what a name stands for
    in the scopes around it, and the checks a name, path, attribute chain or import gets."""

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

    def import_path(self, name: str) -> str | None:
        """The import a name stands for here, for _dotted (None for anything else)."""
        kinds = self.lookup(name) or set()
        imports = [k.split(":", 1)[1] for k in kinds if k.startswith("import:")]
        return imports[0] if len(imports) == 1 and len(kinds) == 1 else None

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
                               "the list of what a kernel wrapper needs (grader/trusted/audit/allowed.py)")
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

    # -- Triton's compile options and source text

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

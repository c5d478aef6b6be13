"""The Python audit: what a submission's .py files use, read by the grader before any of its code
runs, against the lists of grader/trusted/audit/allowed.py (issue 30). Trusted side: nothing here imports,
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
instructor has looked (grader/course/review.py). The body of `if __name__ == "__main__":` never runs
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
gadget; the review queue (grader/course/review.py) and the trusted observations (grader/trusted/integrity.py)
are beneath the audit.

Here: the entry points (audit_python, audit_folder, describe). The files, parsed, are read in
python_files.py; paths through the allowed modules in paths.py; scopes in scopes.py; one file's
walk in walk.py, through the checks of rules.py; what a kernel is in python_kernels.py.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

from grader.course.submission import split_sources
from grader.trusted.audit.findings import ReachFinding
from grader.trusted.audit.python_files import _own_attributes, _own_modules, _parsed, _unread
from grader.trusted.audit.scopes import _Context
from grader.trusted.audit.walk import _Audit


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


def describe(findings, limit: int = 8) -> list[str]:
    """'file line N: what (why)' for each finding, at most `limit`, then how many more."""
    lines = [f.describe() for f in findings[:limit]]
    if len(findings) > limit:
        lines.append(f"... and {len(findings) - limit} more")
    return lines


# ---------------------------------------------------------------- the findings


def _unique(findings: list[ReachFinding]) -> list[ReachFinding]:
    """One finding per (where, what): a name used twice on a line is one finding."""
    return list({(f.where, f.what): f for f in findings}.values())

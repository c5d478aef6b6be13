"""The grader's layout (issue 31, docs/design.md): packages by role, small modules and functions.

The import contracts themselves are import-linter's (`make lint`, pyproject.toml); these tests
hold what it does not: sizes, and that each package says what it owns.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

GRADER = Path(__file__).resolve().parents[1] / "grader"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
PACKAGES = ("build", "cli", "common", "course", "executors", "isolation", "problem", "protocol",
            "report", "schedule", "service", "stages", "subject", "trusted")


def _modules() -> list[Path]:
    return sorted(p for p in GRADER.rglob("*.py") if "__pycache__" not in p.parts)


def test_the_grader_is_laid_out_by_role():
    """Every module sits in a package of a role (none loose in grader/ but the entry points),
    and every package's docstring says what it owns."""
    loose = sorted(p.name for p in GRADER.glob("*.py"))
    assert loose == ["__init__.py", "__main__.py"], loose
    found = sorted(p.name for p in GRADER.iterdir() if p.is_dir() and p.name != "__pycache__"
                   and p.name != "skeleton")
    assert found == sorted(PACKAGES)
    for package in PACKAGES:
        doc = ast.get_docstring(ast.parse((GRADER / package / "__init__.py").read_text()))
        assert doc and len(doc.split()) >= 12, f"grader/{package}/__init__.py says too little"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(GRADER)))
def test_modules_and_functions_stay_small(path: Path):
    """No module over MAX_MODULE_LINES lines and no function over MAX_FUNCTION_LINES: a module
    that grows past them is split by responsibility, a function into named steps."""
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES
    long = [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, long


def test_each_module_says_what_it_is():
    """A module a teaching assistant opens starts with what it owns."""
    silent = [str(p.relative_to(GRADER)) for p in _modules()
              if p.name != "__init__.py" and not ast.get_docstring(ast.parse(p.read_text()))]
    assert not silent, silent

"""Shared fixtures: throw-away submission folders and small cases."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

from grader.common import config
from grader.problem import Case

REPO = config.REPO_ROOT
EXAMPLES = REPO / "examples"


def ctrl_c_reaches_it() -> None:
    """preexec_fn for a grader a test will Ctrl-C: SIGINT as a terminal gives it. A test run
    started in the background by a non-interactive shell inherits SIGINT ignored, and Python
    leaves an ignored SIGINT ignored (no KeyboardInterrupt ever comes)."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def has_nvcc() -> bool:
    from grader.isolation.device import find_nvcc
    return find_nvcc() is not None


def cuda_available() -> bool:
    import torch
    return torch.cuda.is_available()


def expected_verdicts() -> dict[str, dict[str, str]]:
    data = json.loads((EXAMPLES / "expected.json").read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


@pytest.fixture
def make_submission(tmp_path):
    """make_submission(name, python_source) -> folder with submission.py (or .cu by filename)."""
    root = tmp_path / "submissions"

    def make(name: str, source: str, filename: str = "submission.py") -> Path:
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / filename).write_text(textwrap.dedent(source))
        return folder

    make.root = root
    return make


@pytest.fixture
def copy_example(tmp_path):
    def copy(name: str, root: Path) -> Path:
        dest = root / name
        shutil.copytree(EXAMPLES / name, dest, symlinks=False)
        return dest
    return copy


@pytest.fixture
def small_case() -> Case:
    return Case(batch_size=1, num_heads=2, seq_len=77, head_dim=64, seed=11)


@pytest.fixture(autouse=True)
def _no_stop_outlives_its_test():
    """A test whose grading run stopped (cancel_all: Ctrl-C, a GPU failure, or a failed assertion
    inside grade_all) leaves the process-wide "stopping" flag set, and every later test's child
    process would be refused ("the run is stopping"): one failure became thirty in one run of
    `make test` (session 21). Each test starts with none."""
    yield
    from grader.isolation import procs
    if procs.stopping():
        procs.end_run()

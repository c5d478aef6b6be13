"""Find submissions: a submission is a folder whose name is the student's id."""

from __future__ import annotations

import dataclasses
import enum
import re
from pathlib import Path

CUDA_FILE = "submission.cu"
PYTHON_FILE = "submission.py"


class Kind(str, enum.Enum):
    CUDA = "cuda"
    PYTHON = "python"
    INVALID = "invalid"   # neither file, or both: a verdict, not a traceback


class Role(str, enum.Enum):
    STUDENT = "student"
    BASELINE = "baseline"


@dataclasses.dataclass(frozen=True)
class Submission:
    id: str
    path: Path
    kind: Kind
    role: Role = Role.STUDENT
    problem: str = ""     # why the folder is INVALID

    @property
    def source(self) -> Path:
        return self.path / (CUDA_FILE if self.kind is Kind.CUDA else PYTHON_FILE)

    @property
    def module_name(self) -> str:
        """A Python identifier unique to this submission, for the extension module."""
        return "sub_" + re.sub(r"\W", "_", self.id)


def inspect_folder(path: Path, *, role: Role = Role.STUDENT, id: str | None = None) -> Submission:
    path = Path(path).absolute()   # absolute, not resolved: a symlinked folder keeps its name
    sid = id or path.name
    has_cu, has_py = (path / CUDA_FILE).is_file(), (path / PYTHON_FILE).is_file()
    if not path.is_dir():
        return Submission(sid, path, Kind.INVALID, role, f"{path} is not a folder.")
    if has_cu and has_py:
        return Submission(sid, path, Kind.INVALID, role,
                          f"{path} has both {CUDA_FILE} and {PYTHON_FILE}; a submission is one of "
                          f"them. Remove the one you do not want graded.")
    if not (has_cu or has_py):
        found = ", ".join(sorted(p.name for p in path.iterdir())[:8]) or "nothing"
        return Submission(sid, path, Kind.INVALID, role,
                          f"{path} has neither {CUDA_FILE} nor {PYTHON_FILE} (found: {found}). "
                          f"Name your file exactly {CUDA_FILE} (CUDA) or {PYTHON_FILE} (Triton or "
                          f"another Python DSL).")
    return Submission(sid, path, Kind.CUDA if has_cu else Kind.PYTHON, role)


def discover(root: Path) -> list[Submission]:
    """Every sub-folder of `root`, sorted by name; `root` itself if it is a submission folder."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such folder of submissions. Pass a folder that "
                                f"contains one folder per student, or one submission folder.")
    if (root / CUDA_FILE).exists() or (root / PYTHON_FILE).exists():
        return [inspect_folder(root)]
    return [inspect_folder(p) for p in sorted(root.iterdir())
            if p.is_dir() and not p.name.startswith((".", "_"))]

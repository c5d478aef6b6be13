"""Find submissions: a submission is a folder whose name is the student's id."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import os
import re
import unicodedata
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
        """An ASCII Python identifier unique to this submission (its extension module and its
        build folder): a readable part, and a hash of the exact id, so ids that differ only in
        punctuation, case or accents never share one, and any Unicode id builds."""
        readable = unicodedata.normalize("NFKD", self.id).encode("ascii", "ignore").decode()
        readable = re.sub(r"[^A-Za-z0-9]+", "_", readable).strip("_")[:40]
        digest = hashlib.sha256(self.id.encode("utf-8", "surrogatepass")).hexdigest()[:10]
        prefix = "ref" if self.role is Role.BASELINE else "sub"
        return f"{prefix}_{readable}_{digest}" if readable else f"{prefix}_{digest}"

    @property
    def build_namespace(self) -> str:
        """Students' builds and the reference's never share a folder, whatever the id."""
        return "reference" if self.role is Role.BASELINE else "students"


FILE_MARK = "\x1e"   # a line "FILE_MARK<name>" starts each file in read_sources' text
SOURCE_SUFFIXES = (".py", ".cu", ".cuh", ".h", ".hpp", ".cpp", ".cc", ".c")
SOURCE_LIMITS = dict(files=200, file_bytes=1 << 20, total_bytes=8 << 20)


def read_sources(folder: Path) -> str:
    """Every source file of a submission's folder (where its kernels' names are defined), read
    before any of its code runs, within limits: regular files with a source suffix, at most 200
    of them, 1 MiB each and 8 MiB in all, symbolic links not followed. A sparse multi-GiB file is
    skipped by its size, never read."""
    texts, total = [], 0
    walked = 0
    for root, dirs, files in os.walk(folder, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            walked += 1
            if walked > 10 * SOURCE_LIMITS["files"] or len(texts) >= SOURCE_LIMITS["files"]:
                return "\n".join(texts)
            path = Path(root) / name
            if not name.endswith(SOURCE_SUFFIXES) or path.is_symlink():
                continue
            try:
                size = path.stat().st_size
                if size > SOURCE_LIMITS["file_bytes"] or total + size > SOURCE_LIMITS["total_bytes"]:
                    continue
                with open(path, "rb") as f:
                    data = f.read(SOURCE_LIMITS["file_bytes"])
            except OSError:
                continue
            total += len(data)
            texts.append(FILE_MARK + str(path.relative_to(folder)) + "\n"
                         + data.decode("utf-8", errors="replace"))
    return "\n".join(texts)


def split_sources(text: str) -> dict[str, str]:
    """read_sources' text as {relative path: file text}; text without its marks is one file
    named ''."""
    files, name, lines = {}, "", []
    for line in text.split("\n"):   # not splitlines(): FILE_MARK is a line break to it
        if line.startswith(FILE_MARK):
            if lines or name:
                files[name] = "\n".join(lines)
            name, lines = line[1:], []
        else:
            lines.append(line)
    if lines or name:
        files[name] = "\n".join(lines)
    return files


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


def discover(root: Path, *, scratch: Path | None = None) -> list[Submission]:
    """Every student of a drop, sorted by id; `root` itself if it is a submission folder. The
    layouts a course gets (folders, nested folders, archives, Canvas and Gradescope exports) and
    the entries left out, with why, are grader/intake.py's: `open_drop` returns both. Raises
    intake.DropError for a missing path or a drop with nothing to grade."""
    from .intake import open_drop   # intake builds on this module
    from . import config
    scratch = scratch or config.DEFAULT_BUILD / config.DROP_SCRATCH
    return list(open_drop(Path(root), scratch=scratch).submissions)

"""The check service's client, packing a folder (issue 33, grader/cli/client.py): the submission
folder as the .zip it is sent as, within the drop's own limits (config.STUDENT_ARCHIVE), what is
left out and why, and a refusal naming the largest files before a byte is sent."""

from __future__ import annotations

import dataclasses
import io
import os
import stat
import time
import zipfile
from pathlib import Path

from grader.common import config
from grader.course.submission import CUDA_FILE, PYTHON_FILE, read_regular

from grader.cli.client_http import EXIT_REFUSED, EXIT_USAGE, ClientError

# Left out of an upload: what a build or an editor makes, never the submission itself.
BUILD_DIRS = frozenset({"__pycache__", "build", "results", "dist", "node_modules"})
BUILD_SUFFIXES = (".o", ".obj", ".so", ".a", ".pyc", ".pyo", ".cubin", ".fatbin", ".egg-info")


# ---------------------------------------------------------------------------- packing a folder


@dataclasses.dataclass(frozen=True)
class Packed:
    """A submission folder as it is sent: the .zip's bytes, the files in it (relative, with their
    sizes), and what was left out with why."""
    data: bytes
    files: tuple[tuple[str, int], ...]
    left_out: tuple[tuple[str, str], ...]

    @property
    def unpacked_bytes(self) -> int:
        return sum(size for _, size in self.files)


def pack_folder(folder: Path, limits: config.ArchiveLimits = config.STUDENT_ARCHIVE) -> Packed:
    """`folder` as an in-memory .zip, files at its root, within `limits` (the drop's own, which
    the service unpacks with); ClientError (usage) for a folder that is no submission, (refused)
    over a limit, naming the largest files."""
    problem = submission_problem(folder)
    if problem:
        raise ClientError(problem, EXIT_USAGE)
    chosen, left_out = _choose_files(folder, limits.max_files)
    total = sum(size for _, _, size in chosen)
    if len(chosen) > limits.max_files or total > limits.max_bytes:
        raise ClientError(_too_large(folder, chosen, limits), EXIT_REFUSED)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        for rel, path, size in chosen:
            try:   # never through a link, never a pipe or device (submission.open_regular)
                data = read_regular(path, size + (1 << 20))
            except OSError as e:
                raise ClientError(f"{folder / rel}: cannot read it ({e.strerror or e})",
                                  EXIT_USAGE) from None
            info = zipfile.ZipInfo(rel, date_time=_zip_time(path))
            info.external_attr = 0o644 << 16   # a plain file, whatever it was here
            z.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
    data = buffer.getvalue()
    if total > limits.ratio_floor_bytes and total > limits.max_ratio * len(data):
        raise ClientError(f"{folder} packs {human_size(total)} into {human_size(len(data))}, "
                          f"more than {limits.max_ratio:g} to 1: the service refuses such an "
                          f"archive (a zip bomb's ratio). {largest(chosen)}. Leave generated data "
                          f"out of the folder: a submission is its source files. Nothing was sent",
                          EXIT_REFUSED)
    return Packed(data, tuple((rel, size) for rel, _, size in chosen), tuple(left_out))


def submission_problem(folder: Path) -> str:
    """Why `folder` is not a submission folder ('' if it is): it must be a folder holding
    submission.cu or submission.py, not both (the service refuses the rest with 422)."""
    example = "for example: make submit SUBMISSION=student (python -m grader submit student)"
    if not folder.is_dir():
        if folder.name in (CUDA_FILE, PYTHON_FILE):
            return f"{folder} is a file; submit the folder that holds it: {folder.parent}"
        return f"{folder}: no such folder. Submit the folder that holds your submission, {example}"
    has_cu, has_py = (folder / CUDA_FILE).is_file(), (folder / PYTHON_FILE).is_file()
    if has_cu and has_py:
        return (f"{folder} has both {CUDA_FILE} and {PYTHON_FILE}; a submission is one of them. "
                f"Remove the one you do not want graded")
    if not (has_cu or has_py):
        return (f"{folder} has neither {CUDA_FILE} nor {PYTHON_FILE}: submit the folder that "
                f"holds yours, {example}")
    return ""


def _choose_files(folder: Path, max_files: int) -> tuple[list[tuple[str, str, int]],
                                                          list[tuple[str, str]]]:
    """(rel, path, size) of every file to send, and (rel, why) of what is left out. Entries are
    looked at with lstat only (no link followed); left-out folders are not walked; the walk stops
    past `max_files` files (the caller refuses the folder then)."""
    chosen: list[tuple[str, str, int]] = []
    left_out: list[tuple[str, str]] = []
    stack = [""]
    while stack and len(chosen) <= max_files:
        rel_dir = stack.pop()
        try:
            with os.scandir(folder / rel_dir if rel_dir else folder) as it:
                children = sorted(it, key=lambda e: e.name)
        except OSError as e:
            raise ClientError(f"{folder / rel_dir}: cannot list it ({e.strerror}); make it "
                              f"readable or move it out of the folder", EXIT_USAGE) from None
        subdirs = []
        for child in children:
            rel = f"{rel_dir}/{child.name}" if rel_dir else child.name
            try:
                st = child.stat(follow_symlinks=False)
            except OSError:
                continue   # gone since the listing
            why = _left_out(folder, rel, child.name, st.st_mode)
            if why:
                left_out.append((rel + ("/" if stat.S_ISDIR(st.st_mode) else ""), why))
            elif stat.S_ISDIR(st.st_mode):
                subdirs.append(rel)
            else:
                chosen.append((rel, child.path, st.st_size))
        stack.extend(reversed(subdirs))
    return chosen, left_out


def _left_out(folder: Path, rel: str, name: str, mode: int) -> str:
    """Why an entry is not sent ('' if it is)."""
    if name.startswith("."):
        return "hidden"
    if stat.S_ISDIR(mode):
        if name in BUILD_DIRS or name.endswith(".egg-info"):
            return "build output"
        if (folder / rel / CUDA_FILE).is_file() or (folder / rel / PYTHON_FILE).is_file():
            return "another submission folder: send it by itself"
        return ""
    if stat.S_ISLNK(mode):
        return "a link: copy the file itself into the folder if your submission needs it"
    if not stat.S_ISREG(mode):
        return "not a regular file"
    if name.endswith(BUILD_SUFFIXES):
        return "build output"
    return ""


def _zip_time(path: str) -> tuple[int, int, int, int, int, int]:
    t = time.localtime(os.lstat(path).st_mtime)
    return (max(t.tm_year, 1980), t.tm_mon, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec)


def _too_large(folder: Path, chosen: list, limits: config.ArchiveLimits) -> str:
    total = sum(size for _, _, size in chosen)
    return (f"{folder} is too large to submit: {len(chosen)} files, {human_size(total)}; the "
            f"course takes at most {limits.max_files} files and {human_size(limits.max_bytes)}. "
            f"{largest(chosen)}. A submission is its source files: move data, builds and "
            f"outputs out of the folder. Nothing was sent")


def largest(chosen: list, n: int = 5) -> str:
    top = sorted(chosen, key=lambda c: -c[2])[:n]
    return "The largest: " + ", ".join(f"{rel} ({human_size(size)})" for rel, _, size in top)


def human_size(n: int) -> str:
    if n < 1 << 10:
        return f"{n} B"
    if n < 1 << 20:
        return f"{n / (1 << 10):.1f} KB"
    return f"{n / (1 << 20):.1f} MB"

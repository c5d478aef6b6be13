"""One student's entry of a course drop as a Submission: a folder (the submission at its top,
one level down, or in the one archive it holds) or an archive, unpacked safely; `Skipped` for an
entry that is not graded, with why."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from grader.common import config
from grader.course.archives import ArchiveRejected, _is_archive, _slug, unpack
from grader.course.submission import (CUDA_FILE, PYTHON_FILE, Kind, Submission, inspect_folder,
                                      refusal, unsafe_entries)


JUNK = ("__MACOSX",)                        # macOS's resource forks in a zip


@dataclasses.dataclass(frozen=True)
class Skipped:
    entry: str      # the name as it is in the drop ("_old/", "alice_1_2_submission-1.cu")
    reason: str

    def to_dict(self) -> dict:
        return dict(entry=self.entry, reason=self.reason)


def student_folder(folder: Path, sid: str, scratch: Path, limits: config.ArchiveLimits, *,
                   archive_inside: bool = True) -> Submission | Skipped:
    """A student's folder: the submission at its top, one level down (`hw4/submission.cu`), or
    in the one archive it holds. A folder with no file at all is skipped; one with files but no
    submission is an INVALID submission (the student's row says what was found). The whole
    folder is checked first (submission.unsafe_entries): a pipe, socket or device anywhere in it,
    or a link out of it (to another student's archive), refuses it before anything is read."""
    if _has_submission(folder):
        return inspect_folder(folder, id=sid)
    unsafe = unsafe_entries(folder)
    if unsafe:
        return Submission(sid, folder.absolute(), Kind.INVALID, problem=refusal(unsafe))
    visible = [p for p in sorted(folder.iterdir()) if not p.name.startswith(".") and p.name not in JUNK]
    if not visible:
        return Skipped(folder.name, "an empty folder")
    nested = [p for p in visible if p.is_dir() and _has_submission(p)]
    if len(nested) == 1:
        return inspect_folder(nested[0], id=sid)
    if len(nested) > 1:
        names = ", ".join(p.name + "/" for p in nested)
        return Submission(sid, folder.absolute(), Kind.INVALID, problem=(
            f"{folder.name}/ holds several submissions ({names}); keep one folder with "
            f"{CUDA_FILE} or {PYTHON_FILE}."))
    archives = [p for p in visible if p.is_file() and _is_archive(p.name)]
    if archive_inside and len(archives) == 1 and len(visible) == 1:
        return student_archive(archives[0], sid, scratch, limits)
    return inspect_folder(folder, id=sid)


def student_archive(archive: Path, sid: str, scratch: Path,
                    limits: config.ArchiveLimits) -> Submission:
    """A student's .zip/.tar.gz, unpacked into scratch; a broken rule is the student's verdict."""
    dest = scratch / "students" / _slug(str(archive.absolute()))   # per archive: two of one id never share it
    try:
        unpack(archive, dest, limits)
    except ArchiveRejected as e:
        return Submission(sid, archive.absolute(), Kind.INVALID, problem=(
            f"{archive.name}: {e}. Nothing of it was graded; upload a .zip or .tar.gz of your "
            f"folder with {CUDA_FILE} or {PYTHON_FILE}."))
    root = _single_top_folder(dest)
    # an archive inside is not unpacked: no chain of archives can multiply the limits
    found = student_folder(root, sid, scratch, limits, archive_inside=False) if root.is_dir() else None
    if isinstance(found, Submission):
        return found
    return Submission(sid, dest.absolute(), Kind.INVALID, problem=(
        f"{archive.name} holds no files; upload a .zip or .tar.gz of your folder with "
        f"{CUDA_FILE} or {PYTHON_FILE}."))


def _has_submission(folder: Path) -> bool:
    return (folder / CUDA_FILE).is_file() or (folder / PYTHON_FILE).is_file()


def _single_top_folder(dest: Path) -> Path:
    """An archive of a folder (`alice.zip` holding `alice/...`): that folder."""
    try:
        top = [p for p in dest.iterdir() if p.name not in JUNK and not p.name.startswith(".")]
    except OSError:
        return dest
    if len(top) == 1 and top[0].is_dir() and not _has_submission(dest):
        return top[0]
    return dest

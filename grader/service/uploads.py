"""What the service accepts as an upload (issue 33): a .zip or .tar.gz of one submission folder,
checked whole before anything is kept (Store.accept) or graded.

The rules, each refused with an HTTP status and a reason the student can act on:
- at most the course's `[service] upload_mb` (grading.toml): 413;
- a .zip or a gzip'd tar, told by its first bytes, not its name: 415;
- unpacked by the drop's own rules (course/archives.py): plain files and folders only, no
  absolute path or '..', no link, device or pipe, within the files, bytes and ratio of
  config.STUDENT_ARCHIVE (a bomb is stopped as it is written): 400;
- a submission folder (submission.cu or submission.py, not both) at its root, or inside its one
  top folder: 422.
Nothing of a refused upload is kept: it was unpacked in a scratch folder that is removed.

unpack_upload unpacks an accepted upload for grading (grader/service/worker.py), by the same
rules with the drop's own limits, into exactly the folder it is given.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path

from grader.common import config
from grader.course.archives import ArchiveRejected, unpack
from grader.course.service_drop import GZIP_MAGIC, ZIP_MAGIC, submission_root as _submission_root
from grader.course.submission import Kind, inspect_folder


@dataclasses.dataclass(frozen=True)
class UploadCheck:
    """An upload's verdict: `status` 0 when it may be accepted (then `kind`: cuda or python), else
    the HTTP status and the reason to send back."""
    status: int
    reason: str = ""
    kind: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 0


def check_upload(data: bytes, *, max_bytes: int, scratch: Path | None = None) -> UploadCheck:
    """Whether `data` is an acceptable upload (the rules above); unpacked in a temporary folder
    under `scratch`, removed before this returns."""
    if len(data) > max_bytes:
        return UploadCheck(413, f"the upload is {_mb(len(data))}; this course takes at most "
                                f"{_mb(max_bytes)} (grading.toml [service] upload_mb). Upload "
                                f"your submission folder's sources only")
    name = _archive_name(data)
    if not name:
        return UploadCheck(415, "the upload is not a .zip or .tar.gz of your submission folder "
                                "(make submit makes one)")
    limits = dataclasses.replace(config.STUDENT_ARCHIVE, max_bytes=min(
        config.STUDENT_ARCHIVE.max_bytes, max(max_bytes * 16, 1 << 20)))
    with tempfile.TemporaryDirectory(prefix="upload-", dir=scratch) as tmp:
        archive, folder = Path(tmp) / name, Path(tmp) / "unpacked"
        archive.write_bytes(data)
        try:
            unpack(archive, folder, limits)
        except ArchiveRejected as e:
            return UploadCheck(400, f"the archive {e}")
        root = _submission_root(folder)
        sub = inspect_folder(root, id="upload")
        if sub.kind is Kind.INVALID:
            return UploadCheck(422, sub.problem.replace(str(root), "the uploaded folder"))
        return UploadCheck(0, kind=sub.kind.value)


def unpack_upload(data_or_path: bytes | Path, dest: Path) -> Path:
    """An accepted upload (its bytes, or its file under the store's uploads/) unpacked for
    grading: its submission folder (at the archive's root or in its one top folder) becomes
    `dest`, replaced if it exists. ArchiveRejected when it breaks the drop's rules
    (config.STUDENT_ARCHIVE) or is not a .zip or .tar.gz; nothing is left of it then."""
    data = data_or_path if isinstance(data_or_path, bytes) else Path(data_or_path).read_bytes()
    name = _archive_name(data)
    if not name:
        raise ArchiveRejected("is not a .zip or .tar.gz (its first bytes say neither)")
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{dest.name}-", dir=dest.parent) as tmp:
        archive, folder = Path(tmp) / name, Path(tmp) / "unpacked"
        archive.write_bytes(data)
        unpack(archive, folder, config.STUDENT_ARCHIVE)
        if dest.exists():
            shutil.rmtree(dest)
        _submission_root(folder).rename(dest)
    return dest


def _archive_name(data: bytes) -> str:
    """The name archives.unpack reads the format from, told by the first bytes; '' for neither."""
    if data.startswith(ZIP_MAGIC):
        return "upload.zip"
    if data.startswith(GZIP_MAGIC):
        return "upload.tar.gz"
    return ""


def _mb(n: int) -> str:
    return f"{n / (1 << 20):.1f} MB"

"""Safe unpacking of a course drop's archives (a student's .zip/.tar.gz, or the drop itself):
plain files and folders only, every path inside the destination, the files, bytes and ratio
within config.ArchiveLimits, or ArchiveRejected and nothing kept. Also the names archives get:
which names are archives, an archive's stem, the scratch folder an archive unpacks into."""

from __future__ import annotations

import bz2
import contextlib
import errno
import gzip
import hashlib
import lzma
import os
import re
import shutil
import stat
import tarfile
import unicodedata
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from grader.common import config
from grader.course.submission import NotRegular, kind_of, open_regular


ARCHIVES = (".zip", ".tar.gz", ".tgz", ".tar", ".tar.bz2", ".tar.xz")


# Errors of the machine while unpacking: the entry is listed as not graded, never scored.
MACHINE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EMFILE, errno.ENFILE, errno.EIO,
                            errno.EROFS, errno.ENOMEM})


class ArchiveRejected(ValueError):
    """One archive broke a rule; the message names it and the limit."""


def unpack(archive: Path, dest: Path, limits: config.ArchiveLimits) -> None:
    """Unpack a .zip or .tar(.gz/.bz2/.xz) into `dest` (emptied first), or raise ArchiveRejected
    and keep nothing. Rules: every member a plain file or folder (no links, devices or pipes), no
    absolute path or '..', at most `limits.max_files` members and `limits.max_bytes` unpacked
    (counted as written, whatever the headers say), and no more than `limits.max_ratio` times the
    archive's size. Files are written 0644, folders 0755. The archive itself is opened only if it
    is a regular file, without blocking (submission.open_regular): a named pipe put where an
    archive was is refused, never read."""
    try:
        fd, st = open_regular(archive, follow_links=True)   # a drop's own links are followed
    except NotRegular as e:
        raise ArchiveRejected(f"is {e.what}; remove it") from None
    with os.fdopen(fd, "rb") as raw:
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        budget = _Budget(limits, max(1, st.st_size))
        try:
            if archive.name.lower().endswith(".zip"):
                _unpack_zip(raw, dest, budget)
            else:
                _unpack_tar(archive.name, raw, dest, budget)
        except ArchiveRejected:
            shutil.rmtree(dest, ignore_errors=True)
            raise
        except OSError as e:
            shutil.rmtree(dest, ignore_errors=True)
            if e.errno in MACHINE_ERRNOS:   # the grading machine's disk or limits, not the student's
                raise
            raise ArchiveRejected(f"cannot be unpacked ({type(e).__name__}: {e})") from None
        except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError,
                ValueError, NotImplementedError, RuntimeError) as e:
            shutil.rmtree(dest, ignore_errors=True)
            raise ArchiveRejected(f"cannot be unpacked ({type(e).__name__}: {e})") from None


class _Budget:
    """Bytes and files unpacked so far, against the limits."""

    def __init__(self, limits: config.ArchiveLimits, packed: int):
        self.limits, self.packed, self.bytes, self.files = limits, packed, 0, 0

    def member(self, declared: int = 0) -> None:
        self.files += 1
        if self.files > self.limits.max_files:
            raise ArchiveRejected(f"holds more than {self.limits.max_files} files (the limit)")
        self.check(self.bytes + declared)

    def add(self, n: int) -> None:
        self.bytes += n
        self.check(self.bytes)

    def check(self, total: int) -> None:
        if total > self.limits.max_bytes:
            raise ArchiveRejected(f"unpacks to more than {_size(self.limits.max_bytes)} (the limit)")
        if total > self.limits.ratio_floor_bytes and total / self.packed > self.limits.max_ratio:
            raise ArchiveRejected(
                f"unpacks to {total / self.packed:.0f}x its size or more ({_size(total)} from "
                f"{_size(self.packed)}; the limit is {self.limits.max_ratio:.0f}x): a zip bomb?")


def _safe_path(dest: Path, name: str) -> Path | None:
    """Where member `name` goes under `dest`, or ArchiveRejected; None for the archive's root."""
    posix = name.replace("\\", "/")
    if posix.startswith("/") or re.match(r"^[A-Za-z]:", posix):
        raise ArchiveRejected(f"holds an absolute path ({name!r}); an archive's paths must stay "
                              f"inside its folder")
    parts = [p for p in PurePosixPath(posix).parts if p not in ("", ".")]
    if ".." in parts:
        raise ArchiveRejected(f"holds a path that leaves its folder ({name!r}, a zip-slip)")
    if not parts:
        return None
    if any("\x00" in p or len(p.encode("utf-8", "surrogateescape")) > 255 for p in parts):
        raise ArchiveRejected(f"holds a file name the disk cannot hold ({name[:80]!r})")
    target = dest.joinpath(*parts)
    if not str(target.resolve()).startswith(str(dest.resolve()) + os.sep):
        raise ArchiveRejected(f"holds a path that leaves its folder ({name!r})")
    return target


def _write(target: Path, stream, budget: _Budget) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "wb") as out:
        while chunk := stream.read(1 << 16):
            budget.add(len(chunk))
            out.write(chunk)
    os.chmod(target, 0o644)


def _unpack_zip(archive, dest: Path, budget: _Budget) -> None:
    with zipfile.ZipFile(archive) as zf:   # `archive`: the open file
        infos = zf.infolist()
        if len(infos) > budget.limits.max_files:
            raise ArchiveRejected(f"holds more than {budget.limits.max_files} files (the limit; "
                                  f"it holds {len(infos)})")
        budget.check(sum(i.file_size for i in infos))   # what the headers declare, before any byte
        for info in infos:
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                raise ArchiveRejected(f"holds a symbolic link ({info.filename!r}); a submission "
                                      f"is plain files: remove it")
            if info.flag_bits & 0x1:
                raise ArchiveRejected(f"is encrypted ({info.filename!r}); upload it without a password")
            target = _safe_path(dest, info.filename)
            budget.member()
            if target is None:
                continue
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            if mode and not (stat.S_ISREG(mode) or stat.S_IFMT(mode) == 0):
                raise ArchiveRejected(f"holds {info.filename!r}, {kind_of(mode)}, not a plain "
                                      f"file: remove it")
            with zf.open(info) as stream:
                _write(target, stream, budget)
    _fix_folder_modes(dest)


class _CountingReader:
    """A decompressed stream that stops at the budget: a gzip bomb is never read past it."""

    def __init__(self, raw, budget: _Budget):
        self.raw, self.budget, self.read_bytes = raw, budget, 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n if n is not None and n >= 0 else 1 << 20)
        self.read_bytes += len(data)
        # headers and padding are 512-byte blocks; allow them on top of the content
        self.budget.check(max(0, self.read_bytes - 1024 * (self.budget.files + 2) - (16 << 10)))
        return data


def _unpack_tar(name: str, archive, dest: Path, budget: _Budget) -> None:
    """`archive`: the open file of the archive called `name`."""
    name = name.lower()
    opener = (gzip.open if name.endswith((".gz", ".tgz")) else bz2.open if name.endswith(".bz2")
              else lzma.open if name.endswith(".xz") else contextlib.nullcontext)
    with opener(archive) as raw:
        with tarfile.open(fileobj=_CountingReader(raw, budget), mode="r|") as tf:
            for member in tf:
                if member.issym() or member.islnk():
                    raise ArchiveRejected(f"holds a link ({member.name!r} -> {member.linkname!r}); "
                                          f"a submission is plain files: remove it")
                if not (member.isreg() or member.isdir()):
                    raise ArchiveRejected(f"holds {member.name!r}, {_tar_kind(member)}, not a "
                                          f"plain file: remove it")
                target = _safe_path(dest, member.name)
                if hasattr(tarfile, "data_filter"):   # the standard library's own rules, too
                    try:
                        tarfile.data_filter(member, str(dest))
                    except tarfile.FilterError as e:
                        raise ArchiveRejected(f"holds an unsafe member ({e})") from None
                budget.member(member.size if member.isreg() else 0)
                if target is None:
                    continue
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                stream = tf.extractfile(member)
                _write(target, stream, budget)
    _fix_folder_modes(dest)


def _tar_kind(member: tarfile.TarInfo) -> str:
    return ("a named pipe (FIFO)" if member.isfifo() else "a character device" if member.ischr()
            else "a block device" if member.isblk() else f"a member of type {member.type!r}")


def _fix_folder_modes(dest: Path) -> None:
    for root, dirs, _ in os.walk(dest):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
    os.chmod(dest, 0o755)


# ---------------------------------------------------------------- names


def _is_archive(name: str) -> bool:
    return name.lower().endswith(ARCHIVES)


def _archive_stem(name: str) -> str:
    lower = name.lower()
    for suffix in sorted(ARCHIVES, key=len, reverse=True):
        if lower.endswith(suffix):
            return name[:-len(suffix)]
    return name


def _slug(text: str) -> str:
    """A folder name of ASCII that no other text maps to (a readable part and a hash)."""
    readable = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    readable = re.sub(r"[^A-Za-z0-9]+", "_", readable).strip("_")[:40]
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{readable}_{digest}" if readable else digest


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"

"""Find submissions: a submission is a folder whose name is the student's id."""

from __future__ import annotations

import dataclasses
import enum
import errno
import hashlib
import os
import re
import stat
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path

from grader.common.text import clean_line
import json

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
    # An INVALID folder the grading side lost or damaged (a service store's upload that no longer
    # matches its digest: course/service_drop.py), not the student: environment_error, no grade.
    machine_fault: bool = False

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


# ---------------------------------------------------------------- reading a folder safely
#
# A submission's folder is the student's: it may hold a named pipe, a socket, a device node or a
# link, and a read of any of those in the grader's own process can block it, and the whole run
# with it (a pipe with no writer blocks open() forever; /dev/zero never ends). So the grader's
# process looks at a submission's entries with lstat only, and opens one only through
# open_regular: not through a link, never blocking, and only if what it opened is a regular file.


class NotRegular(OSError):
    """What open_regular was asked to open is not a regular file (a link, a pipe, a device);
    `what` says what it is."""

    def __init__(self, path, what: str):
        super().__init__(f"{path}: {what}")
        self.what = what


_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)


def kind_of(mode: int) -> str:
    """What an lstat mode is, in the words a student's message uses."""
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a folder"),
                       (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
                       (stat.S_ISSOCK, "a Unix socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return f"a file of unknown type (mode {stat.S_IFMT(mode):o})"


def open_regular(path: str | os.PathLike, *, follow_links: bool = False) -> tuple[int, os.stat_result]:
    """An open file descriptor of `path` and its fstat, if it is a regular file; else NotRegular
    (or the OSError of the open).

    Invariant: this never blocks and never opens a pipe, socket or device. It looks first (lstat;
    stat with `follow_links`) and opens only a regular file, with O_NONBLOCK (a pipe swapped in
    after the look opens at once, with no writer), O_NOFOLLOW unless `follow_links` (a link
    swapped in fails), O_NOCTTY; then fstat must show the very file it looked at, still regular,
    before the caller reads a byte. The caller closes the descriptor."""
    before = os.stat(path, follow_symlinks=follow_links)
    if not stat.S_ISREG(before.st_mode):
        raise NotRegular(path, f"{kind_of(before.st_mode)}, not a regular file")
    fd = os.open(path, _OPEN_FLAGS | (0 if follow_links else os.O_NOFOLLOW))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            raise NotRegular(path, f"changed while it was opened (now {kind_of(st.st_mode)})")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_regular(path: str | os.PathLike, limit: int, *, follow_links: bool = False) -> bytes:
    """The bytes of the regular file `path` (open_regular: never a link unless `follow_links`,
    never a pipe or device, never blocking), at most `limit` of them: a larger file is an
    OSError (EFBIG), and is never read past the limit."""
    fd, st = open_regular(path, follow_links=follow_links)
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1) if st.st_size <= limit else b""
    if st.st_size > limit or len(data) > limit:   # the second: it grew after fstat
        raise OSError(errno.EFBIG, f"larger than {limit} bytes", str(path))
    return data


@dataclasses.dataclass(frozen=True)
class FolderEntry:
    """One entry under a folder, as lstat saw it (links not followed); a folder that could not
    be listed has `error` set and no `st`."""
    rel: str                          # relative to the folder, '/'-separated
    path: str                         # where it is
    st: os.stat_result | None
    error: OSError | None = None


def walk_folder(folder: str | os.PathLike, *,
                skip_dir: Callable[[str], bool] = lambda name: False) -> Iterator[FolderEntry]:
    """Every entry under `folder`, in os.walk's order: a folder's own entries sorted by name,
    then each subfolder's, sorted. Links are never followed (a link to a folder is an entry, not
    walked) and nothing is opened but folders (os.scandir), so no entry can block the walk.
    Iterative: any depth. `skip_dir(name)`: folders listed but not walked."""
    stack = [("", os.fspath(folder))]
    while stack:
        rel, path = stack.pop()
        try:
            with os.scandir(path) as it:
                children = sorted(it, key=lambda e: e.name)
        except OSError as e:
            if rel:   # the folder itself not being there is the caller's to report
                yield FolderEntry(rel, path, None, e)
            continue
        subdirs = []
        for child in children:
            child_rel = f"{rel}/{child.name}" if rel else child.name
            try:
                st = child.stat(follow_symlinks=False)
            except OSError as e:   # gone since the listing
                yield FolderEntry(child_rel, child.path, None, e)
                continue
            yield FolderEntry(child_rel, child.path, st)
            if stat.S_ISDIR(st.st_mode) and not skip_dir(child.name):
                subdirs.append((child_rel, child.path))
        stack.extend(reversed(subdirs))


# Intake's scan of a submission's folder (hidden entries too) stops here: a folder of more
# entries is refused, since what was not looked at could be anything. 100 000 lstat calls take
# well under a second; a submission is a few source files.
SCAN_LIMIT = 100_000


@dataclasses.dataclass(frozen=True)
class UnsafeEntry:
    """An entry of a submission's folder the grader refuses: where, and what it is."""
    rel: str
    what: str

    def describe(self) -> str:
        return f"{clean_line(self.rel, 200)}: {self.what}"


def unsafe_entries(folder: Path, *, limit: int = SCAN_LIMIT) -> list[UnsafeEntry]:
    """Every entry of `folder` (hidden ones too) that is not a regular file, a folder, or a
    symbolic link that resolves, inside `folder`, to one of those.

    Invariant: after intake, a submission's folder holds no named pipe, socket or device, and no
    link that leaves the folder or dangles, so that nothing the grader reads of it can block or
    read what is not the student's. Looked at with lstat, readlink and realpath only: nothing is
    opened, so the scan itself cannot block. A link inside the folder is allowed: it reads nothing
    the folder does not hold, and the sandbox shows the folder where the grader names it, so it
    resolves the same there (git keeps links, so a student's repository may have one); the
    grader's own readers never follow it (its target is read under its own name), and the reach
    audit still flags a .py link. More than `limit` entries is itself refused: what was not looked
    at could be anything."""
    root = os.path.realpath(folder)
    found: list[UnsafeEntry] = []
    for count, entry in enumerate(walk_folder(folder), start=1):
        if count > limit:
            return found + [UnsafeEntry(".", f"more than {limit} files and folders: too many to "
                                             f"check (a submission is a few source files)")]
        if entry.error is not None:
            why = entry.error.strerror or str(entry.error)
            found.append(UnsafeEntry(entry.rel, f"cannot be read ({why}); make it readable"))
            continue
        mode = entry.st.st_mode
        if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
            continue
        if stat.S_ISLNK(mode):
            why = _link_problem(entry.path, root)
            if why:
                found.append(UnsafeEntry(entry.rel, why))
            continue
        found.append(UnsafeEntry(entry.rel, kind_of(mode)))
    return found


def _link_problem(path: str, root: str) -> str:
    """Why the link `path` is refused ('' if it resolves inside `root` to a file or folder)."""
    try:
        shown = clean_line(os.readlink(path), 200)
    except OSError as e:
        return f"a symbolic link that cannot be read ({e.strerror})"
    try:
        target = os.path.realpath(path, strict=True)
    except OSError as e:   # missing, or a loop
        which = "is a loop" if e.errno == errno.ELOOP else "points to nothing"
        return f"a symbolic link to '{shown}', which {which}"
    if target != root and not target.startswith(root.rstrip(os.sep) + os.sep):
        return f"a symbolic link to '{shown}', outside the submission's folder"
    try:
        mode = os.stat(target, follow_symlinks=False).st_mode
    except OSError as e:
        return f"a symbolic link to '{shown}', which cannot be read ({e.strerror})"
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        return f"a symbolic link to '{shown}', {kind_of(mode)}"
    return ""


def refusal(entries: list[UnsafeEntry], limit: int = 8) -> str:
    """The INVALID verdict's text for a folder with unsafe entries: each one named (relative to
    the folder, whose name may be the student's own), and the fix."""
    lines = ["The submission's folder holds what a submission may not (a named pipe, socket or "
             "device, or a link out of the folder); nothing of it was read or run:"]
    lines += [f"  {e.describe()}" for e in entries[:limit]]
    if len(entries) > limit:
        lines.append(f"  ... and {len(entries) - limit} more")
    lines.append("Remove them and submit again: a submission is regular files and folders (a link "
                 "may point only to a file inside the folder).")
    return "\n".join(lines)


def read_sources(folder: Path) -> str:
    """Every source file of a submission's folder (where its kernels' names are defined), read
    before any of its code runs, within limits: regular files with a source suffix, at most 200
    of them, 1 MiB each and 8 MiB in all, symbolic links not followed, hidden folders left out.
    A sparse multi-GiB file is skipped by its size, never read; a pipe or device is never opened
    (open_regular), so a folder changed after intake cannot block the grader here either. A file
    that holds FILE_MARK is left out: it would split in two in the joined text."""
    texts, total, walked = [], 0, 0
    for entry in walk_folder(folder, skip_dir=lambda d: d.startswith(".")):
        if entry.st is not None and stat.S_ISDIR(entry.st.st_mode):
            continue
        walked += 1
        if walked > 10 * SOURCE_LIMITS["files"] or len(texts) >= SOURCE_LIMITS["files"]:
            break
        if entry.st is None or not stat.S_ISREG(entry.st.st_mode) \
                or not entry.rel.endswith(SOURCE_SUFFIXES):
            continue
        size = entry.st.st_size
        if size > SOURCE_LIMITS["file_bytes"] or total + size > SOURCE_LIMITS["total_bytes"]:
            continue
        try:
            data = read_regular(entry.path, SOURCE_LIMITS["file_bytes"])
        except OSError:
            continue
        if FILE_MARK.encode() in data:
            # the mark would split this file in two in the joined text (a red team hid code
            # after it inside a string, session 19): not read, and so never cleared
            # (audit/python_files._unread names a .py left out)
            continue
        total += len(data)
        texts.append(FILE_MARK + entry.rel + "\n" + data.decode("utf-8", errors="replace"))
    return "\n".join(texts)


def source_text(sub: Submission, limit: int = SOURCE_LIMITS["file_bytes"]) -> str | None:
    """The submission's own file (submission.cu or .py) as text, for its feedback and hints; None
    for an INVALID one or one that cannot be read. Read as read_sources reads: at most `limit`
    bytes, a regular file only, never blocking (read_regular); a link only where it resolves
    inside the folder (intake allows those), never to a file outside it."""
    if sub.kind is Kind.INVALID:
        return None
    try:
        real = os.path.realpath(sub.source, strict=True)
        if not real.startswith(os.path.realpath(sub.path).rstrip(os.sep) + os.sep):
            return None
        return read_regular(real, limit).decode("utf-8", errors="replace")
    except OSError:
        return None


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
    """The submission in folder `path`, or an INVALID one whose problem says what is wrong and
    the fix: not a folder, an unsafe entry (unsafe_entries: a pipe, socket, device, or a link
    that leaves it), both files or neither."""
    path = Path(path).absolute()   # absolute, not resolved: a symlinked folder keeps its name
    sid = id or path.name
    if not path.is_dir():
        return Submission(sid, path, Kind.INVALID, role, f"{path} is not a folder.")
    unsafe = unsafe_entries(path)
    if unsafe:
        return Submission(sid, path, Kind.INVALID, role, refusal(unsafe))
    has_cu, has_py = (path / CUDA_FILE).is_file(), (path / PYTHON_FILE).is_file()
    if has_cu and has_py:
        return Submission(sid, path, Kind.INVALID, role,
                          f"{path} has both {CUDA_FILE} and {PYTHON_FILE}; a submission is one of "
                          f"them. Remove the one you do not want graded.")
    if not (has_cu or has_py):
        names = sorted(p.name for p in path.iterdir())[:8]
        found = ", ".join(clean_line(n, 100) for n in names) or "nothing"
        return Submission(sid, path, Kind.INVALID, role,
                          f"{path} has neither {CUDA_FILE} nor {PYTHON_FILE} (found: {found}). "
                          f"Name your file exactly {CUDA_FILE} (CUDA) or {PYTHON_FILE} (Triton or "
                          f"another Python DSL).")
    return Submission(sid, path, Kind.CUDA if has_cu else Kind.PYTHON, role)


# folder_digest hashes at most this many bytes of a folder's content (an honest folder is a few
# source files); past it, a file counts by its size, inode and change time instead.
DIGEST_CONTENT_BYTES = 256 << 20


def folder_digest(folder: Path, *, hex_chars: int = 16) -> str:
    """A digest of a submission folder's content: every file's path and bytes (a symbolic
    link's target, not what it points to; a pipe, socket or device its kind), caches left out.
    `hex_chars`: 64 for the whole SHA-256 (the build cache's address).

    Invariant: it never blocks. Entries are looked at with lstat (submission.walk_folder) and
    only regular files are opened (submission.open_regular: no link followed, no pipe or device
    opened), so a folder changed after intake cannot hang the run here. The bytes read are capped
    (DIGEST_CONTENT_BYTES); past the cap, a file's size, inode and change time stand for its
    bytes: any change to it still changes the digest, on this machine."""
    h = hashlib.sha256()
    folder = Path(folder)
    if not folder.is_dir():
        return json_digest(["not a folder", str(folder)])
    budget = DIGEST_CONTENT_BYTES
    for entry in walk_folder(folder, skip_dir=lambda name: name == "__pycache__"):
        rel = entry.rel.encode("utf-8", "surrogateescape")
        mode = entry.st.st_mode if entry.st is not None else 0
        if stat.S_ISDIR(mode):
            continue
        try:
            if entry.error is not None:
                raise entry.error
            if stat.S_ISLNK(mode):
                h.update(b"L" + rel + b"\0" + os.readlink(entry.path).encode("utf-8", "surrogateescape"))
            elif stat.S_ISREG(mode):
                tag, payload, read = _file_digest(entry.path, budget)
                budget -= read
                h.update(tag + rel + b"\0" + payload)
            else:   # never opened: a pipe's open or read could block
                h.update(b"S" + rel + b"\0" + kind_of(mode).encode())
        except OSError as e:   # unreadable now: a different key from when it is readable
            h.update(b"E" + rel + b"\0" + str(e.errno).encode())
    return h.hexdigest()[:hex_chars]


def json_digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _file_digest(path: str, budget: int) -> tuple[bytes, bytes, int]:
    """(tag, digest, bytes read) of one regular file: b"F" and the SHA-256 of its bytes, or, for
    a file larger than what is left of the `budget`, b"M" and its size, inode and change time."""
    fd, st = open_regular(path)
    with os.fdopen(fd, "rb") as f:
        if st.st_size <= budget:
            digest, read = hashlib.sha256(), 0
            for chunk in iter(lambda: f.read(1 << 20), b""):
                read += len(chunk)
                if read > budget:   # it grew while being read
                    break
                digest.update(chunk)
            else:
                return b"F", digest.digest(), read
        else:
            read = 0
    return b"M", f"{st.st_size}:{st.st_ino}:{st.st_ctime_ns}".encode(), read

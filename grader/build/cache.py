"""The build cache: a CUDA submission's compiled files, reused when nothing that decides them changed.

An entry is addressed by a digest of everything that decides the build (inputs.build_inputs: the
submission folder's bytes, its module name, the mode, the flags and architecture, nvcc's, the
host compilers', torch's, CUDA's and Python's versions, the grader's build code).
It holds the files later stages read (the extension module, and the object file and the record
of the headers its compile opened, which the reach audit reads: build.cached_files), the build's
log, and a manifest with each file's size and SHA-256.

Trust (the invariant): no process that runs or builds submission code can write the cache. It
lives in the grader's build folder (`build/cache/`); a sandboxed process sees only the system,
the grader's code, its own submission folder (read-only) and, while it builds, its own build
folder (grader/isolation/sandbox.py); a CUDA build runs no submission code at all (nvcc only reads it).
So the cache is used only when the sandbox is active (`usable`), and only for builds that ran
in it (build.build_submission): without one, a submission's run could write an entry another
submission's next build would load. The cache and the build folders are apart by construction
(`build/cache/`, which every run of the clone shares, against each run's
`build/<results>-<hash>/students/<module>/` and `.../reference/<module>/`).

Integrity: an entry is written into a temporary folder beside the others, every file and the
manifest fsynced, and renamed into place whole, last; a build that fails, times out or is killed
stores nothing, and a store that is killed leaves only a temporary folder, never read. A lookup
checks the manifest (schema, key and inputs) and every file's size and digest while it copies
it out; an entry that fails any check is removed and the build runs as if it were not there.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import secrets
import shutil
import sys
import time
from pathlib import Path

from grader.course.submission import open_regular

SCHEMA = 1
FOLDER = "cache"                 # under the grader's build folder
MANIFEST = "manifest.json"
TMP_PREFIX = ".tmp-"             # entries being written; never read
MAX_GB_ENV = "GRADER_BUILD_CACHE_GB"
# A compile check's object is about 190 kB (measured); a linked extension with -lineinfo and its
# object a few MiB (estimated): 20 GiB holds thousands of builds.
DEFAULT_MAX_BYTES = 20 << 30
STALE_TMP_S = 3600               # a temporary folder this old belongs to a store that was killed


@dataclasses.dataclass(frozen=True)
class CachedBuild:
    """What a verified entry gave back: the files are in the build folder now."""
    key: str
    files: tuple[str, ...]
    compile_s: float             # how long the build it replaces took
    log: str                     # that build's whole output (the build log)
    log_tail: str                # BuildResult.log_tail of that build
    created_at: str


class BuildCache:
    """A content-addressed store of successful CUDA builds under `root` (the grader's build
    folder's `cache/`). `reason` says why it is not used where it is not (`usable` false)."""

    def __init__(self, root: Path, *, sandboxed: bool, max_bytes: int | None = None):
        self.root = Path(root).resolve()
        self.sandboxed = sandboxed
        env = os.environ.get(MAX_GB_ENV)
        self.max_bytes = max_bytes if max_bytes is not None else (
            int(float(env) * (1 << 30)) if env else DEFAULT_MAX_BYTES)

    @property
    def usable(self) -> bool:
        return self.sandboxed

    @property
    def reason(self) -> str:
        return "" if self.usable else ("not sandboxed: a submission's process could write the "
                                       "cache, so nothing is reused or stored")

    def describe(self) -> str:
        return f"build cache {self.root}" if self.usable else f"build cache off: {self.reason}"

    # ------------------------------------------------------------ keys

    @staticmethod
    def key(inputs: dict) -> str:
        """The entry's address: a digest of the build's inputs (inputs.build_inputs)."""
        text = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:40]

    def _entry(self, key: str) -> Path:
        return self.root / key[:2] / key

    # ------------------------------------------------------------ lookup

    def restore(self, inputs: dict, into: Path) -> CachedBuild | None:
        """The entry for `inputs`, its files copied into the (emptied) folder `into` and checked
        against the manifest as they are copied; None when there is none or it fails a check
        (then it is removed, and `into` is left empty)."""
        if not self.usable:
            return None
        key = self.key(inputs)
        entry = self._entry(key)
        try:
            manifest = json.loads((entry / MANIFEST).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            self._discard(entry, f"unreadable manifest ({e})")
            return None
        problem = _manifest_problem(manifest, key, inputs)
        if problem:
            self._discard(entry, problem)
            return None
        empty_folder(into)
        for name, want in manifest["files"].items():
            problem = _copy_checked(entry / name, into / name, want)
            if problem:
                empty_folder(into)
                self._discard(entry, problem)
                return None
        try:
            os.utime(entry / MANIFEST)   # recently used: pruned last
        except OSError:
            pass
        return CachedBuild(key=key, files=tuple(manifest["files"]),
                           compile_s=float(manifest["compile_s"]), log=manifest["log"],
                           log_tail=manifest["log_tail"], created_at=manifest["created_at"])

    def _discard(self, entry: Path, why: str) -> None:
        """A bad entry goes; the grader says so once, on its terminal."""
        print(f"build cache: removed entry {entry.name}: {why}", file=sys.stderr, flush=True)
        _remove_entry(entry)

    # ------------------------------------------------------------ store

    def store(self, inputs: dict, source: Path, files: list[str], *, compile_s: float,
              log: str, log_tail: str) -> str:
        """Keep `files` of the build folder `source` (a successful build) under the key of
        `inputs`; written whole or not at all. Returns '' or why nothing was stored (a cache that
        cannot be written never fails a build)."""
        if not self.usable:
            return self.reason
        key = self.key(inputs)
        final = self._entry(key)
        if (final / MANIFEST).exists():
            return ""
        if final.exists():   # a folder with no manifest is no entry: never read, replaced
            _remove_entry(final)
        tmp = self.root / f"{TMP_PREFIX}{key}-{secrets.token_hex(4)}"
        try:
            tmp.mkdir(parents=True)
            digests = {name: _copy_regular(source / name, tmp / name) for name in files}
            manifest = dict(schema=SCHEMA, key=key, inputs=inputs, files=digests,
                            compile_s=round(compile_s, 2), log=log, log_tail=log_tail,
                            created_at=_now())
            _write_synced(tmp / MANIFEST, json.dumps(manifest, indent=1).encode())
            _fsync_dir(tmp)
            final.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(tmp, final)      # whole, or not at all
            except OSError:
                if (final / MANIFEST).exists():   # another run stored the same build first
                    return ""
                raise
            _fsync_dir(final.parent)
        except OSError as e:
            return f"not stored: {e}"
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        self.prune()
        return ""

    def prune(self) -> None:
        """Keep the cache under max_bytes, least recently used entries first, and remove the
        temporary folders of stores that were killed."""
        entries, total = [], 0
        for shard in self._children(self.root):
            if shard.name.startswith(TMP_PREFIX):
                if _age_s(shard) > STALE_TMP_S:
                    shutil.rmtree(shard, ignore_errors=True)
                continue
            for entry in self._children(shard):
                try:   # another thread or run may be removing it
                    size = sum(f.lstat().st_size for f in self._children(entry))
                    used = (entry / MANIFEST).stat().st_mtime
                except OSError:
                    continue
                entries.append((used, size, entry))
                total += size
        for used, size, entry in sorted(entries, key=lambda e: e[0]):
            if total <= self.max_bytes:
                break
            _remove_entry(entry)
            total -= size

    @staticmethod
    def _children(folder: Path) -> list[Path]:
        try:
            return [p for p in folder.iterdir() if not p.is_symlink()]
        except OSError:
            return []


# ---------------------------------------------------------------- files


def empty_folder(folder: Path) -> None:
    """Make `folder` exist and hold nothing (links removed, never followed)."""
    folder.mkdir(parents=True, exist_ok=True)
    for child in folder.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def _manifest_problem(manifest, key: str, inputs: dict) -> str:
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        return "not a manifest of this cache's schema"
    if manifest.get("key") != key or manifest.get("inputs") != json.loads(json.dumps(inputs)):
        return "its manifest is for other inputs"
    files = manifest.get("files")
    if not isinstance(files, dict) or not files or any(
            not isinstance(n, str) or "/" in n or "\0" in n or n.startswith(".") or n == MANIFEST
            for n in files):
        return "its manifest lists no files, or names that are not plain file names"
    if not all(isinstance(manifest.get(f), str) for f in ("log", "log_tail", "created_at")) \
            or not isinstance(manifest.get("compile_s"), (int, float)):
        return "its manifest lacks the build's log or time"
    return ""


def _copy_regular(src: Path, dest: Path) -> dict:
    """Copy a regular file (never through a link) and fsync it; its size, mode and SHA-256.
    `src` is in a build folder a sandboxed build could write: it is opened only if it is a
    regular file, without blocking (submission.open_regular), so a named pipe left there fails
    the store (OSError) instead of hanging the grader."""
    fd, st = open_regular(src)
    with os.fdopen(fd, "rb") as f:
        digest = _stream(f, dest, st.st_mode & 0o755)
    return dict(size=st.st_size, mode=st.st_mode & 0o755, sha256=digest)


def _copy_checked(src: Path, dest: Path, want) -> str:
    """Copy an entry's file out, hashing what is copied; '' or what is wrong with it."""
    if not (isinstance(want, dict) and isinstance(want.get("sha256"), str)
            and isinstance(want.get("size"), int) and isinstance(want.get("mode"), int)):
        return f"its manifest's record of {src.name} is malformed"
    try:
        fd, st = open_regular(src)
    except OSError as e:
        return f"{src.name}: {e.strerror or e}"
    with os.fdopen(fd, "rb") as f:
        if st.st_size != want["size"]:
            return f"{src.name} is not the file it recorded (size {st.st_size}, not {want['size']})"
        digest = _stream(f, dest, want["mode"] & 0o755)
    if digest != want["sha256"]:
        return f"{src.name}'s content does not match its SHA-256 (corrupted)"
    return ""


def _stream(f, dest: Path, mode: int) -> str:
    """Write what `f` holds to a new `dest` (fsynced, `mode`); the SHA-256 of what was written."""
    h = hashlib.sha256()
    out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            _write_all(out, chunk)
        os.fsync(out)
    finally:
        os.close(out)
    os.chmod(dest, mode)   # the umask does not decide who can read a module
    return h.hexdigest()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _write_synced(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_entry(entry: Path) -> None:
    """Rename aside, then delete: a reader never sees half an entry under its key."""
    aside = entry.parent.parent / f"{TMP_PREFIX}gone-{entry.name}-{secrets.token_hex(4)}"
    try:
        os.rename(entry, aside)
    except OSError:
        return
    shutil.rmtree(aside, ignore_errors=True)


def _age_s(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")

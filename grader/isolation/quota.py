"""What a submission's processes may keep in a folder they write (issue 13's red team).

A submission's code writes to two folders of the grading machine: its build folder (a CUDA
compile's objects; a Python submission's import check runs its code there) and the JIT cache of
its GPU stages. Bubblewrap makes the rest read-only or a size-capped tmpfs (sandbox.TMPFS_BYTES),
and RLIMIT_FSIZE caps each file (Limits.file_gb), but nothing capped how many files: one
submission could fill the scratch disk (or /dev/shm, which is memory) and every other submission
graded meanwhile would get an environment error. A size quota per folder needs a mount per
submission, which needs root.

The invariant: **no folder given to a submission's code holds more than Limits.folder_gb or
Limits.folder_files for longer than one poll; then its processes are killed, what it holds is
removed, and the submission's verdict says so.** The grader watches (Quota, one thread in its own
process, where no submission process can see or stop it): every POLL_S it adds up each watched
folder (allocated blocks: a sparse file counts what it uses; the walk stops at the limits). What
is killed is every process of the trees attached to the folder (attach: the harnesses and builds
given it, except a harness itself, which is the grader's), so a writer that hands each file to a
new child still dies with the tree. Between two polls a writer adds at most POLL_S of the disk's
speed (about 2 GiB at 4 GB/s).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from grader.isolation.tree import kill_tree, process_tree, started_at

POLL_S = 0.5


class Watch:
    """One watched folder: its limits, and, once it went over them, what it held then (over)."""

    def __init__(self, folder: Path, limit_bytes: int, limit_files: int):
        self.folder, self.limit_bytes, self.limit_files = Path(folder), limit_bytes, limit_files
        # pid: (when it started, whether the root itself is spared: a harness)
        self.roots: dict[int, tuple[int | None, bool]] = {}
        self.over: tuple[int, int, bool] | None = None   # (bytes, files, unreadable) then

    def message(self, what: str) -> str:
        """The verdict's words, once over: what held how much against which limit."""
        held, files, hidden = self.over or (0, 0, False)
        found = (f"{held / (1 << 30):.1f} GiB in {files} files or more, and some of it made "
                 f"unreadable" if hidden else f"{held / (1 << 30):.1f} GiB in {files} files or more")
        return (f"your code wrote more than the grader allows into {what}: {found} (the limits: "
                f"{self.limit_bytes / (1 << 30):.1f} GiB and {self.limit_files} files). Its "
                f"processes were killed and the files removed, so that other submissions graded "
                f"meanwhile had the machine's scratch space. Cache what you need in memory, not "
                f"on disk")


def usage(folder: Path, limit_bytes: int, limit_files: int) -> tuple[int, int, bool]:
    """(bytes allocated, entries, whether any of it could not be read) under `folder`, counting
    stopped once past either limit. It walks by folder descriptors (os.fwalk), so folders nested
    past PATH_MAX are read too; what vanishes meanwhile (a cache's temporary file renamed) is
    skipped, and anything else it cannot read counts as over (fails closed: a folder its writer
    made unreadable hides nothing)."""
    held = files = 0
    hidden = False

    def unreadable(error: OSError) -> None:
        nonlocal hidden
        hidden = hidden or error.errno != errno.ENOENT

    for _, dirs, names, fd in os.fwalk(str(folder), onerror=unreadable):
        for name in dirs + names:
            files += 1
            try:
                held += os.stat(name, dir_fd=fd, follow_symlinks=False).st_blocks * 512
            except OSError as e:
                unreadable(e)
            if held > limit_bytes or files > limit_files or hidden:
                return held, files, hidden
    return held, files, hidden


class Quota:
    """The folders being watched, and the thread that polls them (started with the first)."""

    def __init__(self, poll_s: float = POLL_S):
        self.poll_s = poll_s
        self._watches: dict[str, Watch] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def watch(self, folder: Path, limit_bytes: int, limit_files: int) -> Iterator[Watch]:
        """`folder` watched while inside; the Watch says whether it went over."""
        watch = Watch(folder, limit_bytes, limit_files)
        key = _key(folder)
        with self._lock:
            self._watches[key] = watch
            if self._thread is None:
                self._thread = threading.Thread(target=self._poll, name="folder-quota", daemon=True)
                self._thread.start()
        try:
            yield watch
        finally:
            with self._lock:
                if self._watches.get(key) is watch:
                    del self._watches[key]

    def attach(self, folder: Path | str | None, root: int, *, spare_root: bool) -> None:
        """The process tree of `root` writes `folder` (a watched one; else nothing): killed, but
        `root` itself when spare_root (a harness: its subject dies, it says so), if the folder
        goes over. Attached until detach, or until the watch ends."""
        with self._lock:
            watch = self._of(folder)
            if watch is not None:
                watch.roots[root] = (started_at(root), spare_root)
                if watch.over is not None:   # over already: nothing of it runs again
                    _kill(root, *watch.roots[root])

    def detach(self, folder: Path | str | None, root: int) -> None:
        with self._lock:
            watch = self._of(folder)
            if watch is not None:
                watch.roots.pop(root, None)

    def hooks(self, folder: Path | str | None, *, spare_root: bool) -> dict:
        """procs.run_limited's `started` and `ended` for a process given `folder`: attached
        while it runs."""
        return dict(started=lambda pid: self.attach(folder, pid, spare_root=spare_root),
                    ended=lambda pid: self.detach(folder, pid))

    def over(self, folder: Path | None) -> Watch | None:
        """The watch of `folder` if it is, or went, over its limits (looked at now too: a writer
        can finish between two polls), else None."""
        with self._lock:
            watch = self._of(folder)
        if watch is not None:
            self._check(watch)
        return watch if watch is not None and watch.over is not None else None

    def _of(self, folder: Path | str | None) -> Watch | None:
        """The watch of `folder`, if it is watched (the lock held)."""
        return self._watches.get(_key(folder)) if folder else None

    def check(self) -> None:
        """One poll: each folder over its limits has its processes killed and is emptied."""
        with self._lock:
            watches = list(self._watches.values())
        for watch in watches:
            self._check(watch)

    def _check(self, watch: Watch) -> None:
        held, files, hidden = usage(watch.folder, watch.limit_bytes, watch.limit_files)
        if held <= watch.limit_bytes and files <= watch.limit_files and not hidden:
            return
        with self._lock:
            if watch.over is None:
                watch.over = (held, files, hidden)
            roots = dict(watch.roots)
        for _ in range(3):   # what the tree started while it was killed, too
            if not any([_kill(root, started, spare) for root, (started, spare) in roots.items()]):
                break
        _empty(watch.folder)

    def _poll(self) -> None:
        while True:
            time.sleep(self.poll_s)
            try:
                self.check()
            except Exception:   # never the grader's end: the next poll tries again
                pass


def _key(folder: Path | str) -> str:
    return str(Path(folder).absolute())


def _kill(root: int, started: int | None, spare_root: bool) -> bool:
    """SIGKILL the tree of `root` (but `root` when spared), if `root` is still the process that
    was attached (not a later one given its pid); whether there was any of it to kill."""
    if started is None or started_at(root) != started:
        return False
    pids = process_tree(root) - ({root} if spare_root else set())
    kill_tree({pid: started_at(pid) for pid in pids})
    return bool(pids)


def _empty(folder: Path) -> None:
    """Everything in `folder` removed, the folder kept (its owner removes it later); folders
    nested past PATH_MAX too (shutil.rmtree works by descriptors). Where the grader is not root
    the writer is the grader's own user, and a folder it made unreadable is made readable again
    (as root none needs to be, and none is changed: a path swapped for a link is never followed)."""
    def readable_again(func, path, _exc) -> None:
        if os.geteuid() == 0 or os.path.islink(path) or not os.path.isdir(path):
            return
        with contextlib.suppress(OSError):
            os.chmod(path, 0o700)
            shutil.rmtree(path, ignore_errors=True)

    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, onerror=readable_again)
        else:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)


QUOTA = Quota()

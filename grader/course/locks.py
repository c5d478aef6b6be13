"""What keeps two grading runs apart: a lock per results folder, one per GPU, and a build folder
per results folder (run_build_dir), so that runs with results folders of their own grade side by
side in one clone.

A lock is an `fcntl.flock` on a file that also names its holder (pid, host, start time,
command). The kernel releases a flock when its holder dies, however it dies, so a lock is never
stuck; a holder that died without releasing leaves its name in the file, and the next run takes
the lock over and says so.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import hashlib
import json
import os
import re
import shlex
import socket
import stat
import subprocess
import sys
from pathlib import Path

from grader.common import config

LOCK_DIR_ENV = "GRADER_LOCK_DIR"       # where the GPU locks live: one folder for the machine
DEFAULT_LOCK_DIR = Path("/tmp/grader-locks")
FOLDER_LOCK = ".grader.lock"           # in the results folder


class LockHeld(RuntimeError):
    """Another live grading run holds the lock."""


def command_line() -> str:
    """This process's command line as typed: 'python -m grader grade course --only alice'."""
    argv = list(sys.argv)
    if argv and argv[0].endswith(os.path.join("grader", "__main__.py")):
        argv[:1] = ["-m", "grader"]
    return " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *argv])


def _holder() -> dict:
    return dict(pid=os.getpid(), host=socket.gethostname(),
                started=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                command=command_line())


def describe(holder: dict) -> str:
    """'pid 4242 on gpu-01, started 2026-11-22T10:03:00+00:00: python -m grader grade course'"""
    return (f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, started "
            f"{holder.get('started', '?')}: {holder.get('command', '?')}")


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError, TypeError):
        return False
    except PermissionError:
        return True
    return True


class RunLock:
    """An exclusive, non-blocking lock on `path`; `what` says what it guards, in messages, and
    `instead` the way around it other than waiting, if there is one."""

    def __init__(self, path: Path, what: str, instead: str = ""):
        self.path, self.what, self.instead = Path(path), what, instead
        self.fd: int | None = None

    def acquire(self) -> str:
        """Take the lock, or raise LockHeld naming the holder. Returns a note when it took over
        the lock of a run that died holding it, else ''."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Never through a link, and only a plain file: a lock folder anyone can write to must not
        # let someone point the lock at a file of the grader's user (it is truncated and written).
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            created = not self.path.exists()
            fd = os.open(self.path, flags, 0o666)
        except OSError as e:
            raise LockHeld(f"cannot open the lock file {self.path} ({self.what}): {e.strerror}; "
                           f"remove it if no grading run is using it") from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            os.close(fd)
            raise LockHeld(f"the lock file {self.path} ({self.what}) is not a plain file of its "
                           f"own (a link?); remove it") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _read(fd)
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise LockHeld(f"cannot lock {self.path} ({self.what}): {e.strerror}") from None
            instead = f", {self.instead}" if self.instead else ""
            raise LockHeld(f"{self.what} is in use by another grading run ({describe(holder)}); "
                           f"wait for it to end{instead}. Lock file: {self.path}") from None
        if created:
            try:
                os.fchmod(fd, 0o666)   # another user's run on the same GPU must be able to open it
            except OSError:
                pass
        previous = _read(fd)
        note = ""
        if previous:
            state = "no longer running" if not _alive(previous.get("pid")) or \
                previous.get("host") != socket.gethostname() else "no longer holding it"
            note = (f"took over the lock on {self.what} from {describe(previous)}: that run "
                    f"ended without releasing it ({state})")
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(_holder()).encode(), 0)
        self.fd = fd
        return note

    def release(self) -> None:
        """Clear the holder's name (a clean end), then unlock."""
        if self.fd is None:
            return
        try:
            os.ftruncate(self.fd, 0)
        finally:
            os.close(self.fd)   # closing the last descriptor releases the flock
            self.fd = None


def _read(fd: int) -> dict:
    try:
        data = os.pread(fd, 65536, 0)
        holder = json.loads(data) if data.strip() else {}
        return holder if isinstance(holder, dict) else {}
    except (OSError, ValueError):
        return {"command": "(unreadable holder record)"}


def lock_dir() -> Path:
    """The machine-wide folder of GPU locks, made writable by every user (sticky, like /tmp)."""
    folder = Path(os.environ.get(LOCK_DIR_ENV) or DEFAULT_LOCK_DIR)
    if not folder.is_dir() and not folder.is_symlink():
        folder.mkdir(parents=True, exist_ok=True)
        try:
            folder.chmod(0o1777)
        except OSError:
            pass
    info = folder.lstat()
    sticky_shared = info.st_uid == 0 and info.st_mode & stat.S_ISVTX
    if not stat.S_ISDIR(info.st_mode) or not (info.st_uid == os.getuid() or sticky_shared):
        # Someone else's folder (or a link) could hold links to our files: use a private one.
        folder = Path(os.environ.get("XDG_RUNTIME_DIR") or Path.home() / ".cache") / "grader-locks"
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return folder


def gpu_identity() -> str:
    """The GPU this process would use: its UUID where nvidia-smi can say, else its index
    (CUDA_VISIBLE_DEVICES' first entry, or 0)."""
    visible = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip() or "0"
    if visible.startswith(("GPU-", "MIG-")):
        return visible
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i", visible],
                             capture_output=True, text=True, timeout=30)
        uuid = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
    except (OSError, subprocess.SubprocessError):
        uuid = ""
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"index{visible}"


def folder_lock(out_dir: Path) -> RunLock:
    """One run at a time writes a results folder. A run refused names the way around: the same
    command with a results folder of its own (`check`'s default is one per submission folder,
    results/check/<folder>, so only two checks of the same folder meet here)."""
    return RunLock(Path(out_dir) / FOLDER_LOCK, f"the results folder {out_dir}",
                   instead=f"or give this run a results folder of its own with --out: "
                           f"{with_out(Path(f'{out_dir}-2'))}")


def run_build_dir(out_dir: Path) -> Path:
    """The build folder of a run that writes `out_dir`, when it is given no --build-dir: where its
    drop is unpacked and its submissions and the reference are built. One per results folder, so
    two runs that may both run (each holds its results folder's lock) never build or unpack in one
    folder: build/<the results folder's name>-<8 hex digits of its real path>, e.g.
    build/results-hw2-3f9a0c1d. Any path to the same results folder gives the same one."""
    real = Path(out_dir).resolve()
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", real.name).strip("._-")[:40] or "results"
    return config.DEFAULT_BUILD / f"{name}-{hashlib.sha256(os.fsencode(real)).hexdigest()[:8]}"


def drop_lock(build_dir: Path, out_dir: Path, *, own: bool) -> RunLock:
    """Unpacking a drop replaces the folders a run grades from: one run at a time unpacks into a
    build folder. A build folder of the results folder's own (`own`: run_build_dir) is met only by
    a second run on that results folder, refused as folder_lock refuses it; a --build-dir that
    two runs share is refused by name."""
    path = Path(build_dir) / ".drop.lock"
    if own:
        same = folder_lock(out_dir)
        return RunLock(path, same.what, same.instead)
    drop = Path(build_dir) / config.DROP_SCRATCH
    return RunLock(path, f"the unpacked drop in {drop}",
                   instead="or give this run a build folder of its own with --build-dir (without "
                           "--build-dir, each results folder has its own)")


def with_out(out_dir: Path) -> str:
    """This process's command as a shell could run it again, its --out replaced by `out_dir`:
    '.venv/bin/python -m grader check student/triton --out results/check/triton-2'."""
    argv, kept, skip = list(sys.argv), [], False
    if argv and argv[0].endswith(os.path.join("grader", "__main__.py")):
        argv[:1] = ["-m", "grader"]
    for arg in argv:
        if skip or arg == "--out" or arg.startswith("--out="):
            skip = arg == "--out"
            continue
        kept.append(arg)
    python = os.path.relpath(sys.executable) if sys.executable.startswith(os.getcwd() + os.sep) \
        else Path(sys.executable).name
    return " ".join(shlex.quote(a) for a in [python, *kept, "--out", _shown(out_dir)])


def _shown(path: Path) -> str:
    """`path` relative to the working folder when it is inside it, else as given."""
    try:
        return str(Path(path).absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def gpu_lock(identity: str, name: str = "") -> RunLock:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in identity)
    return RunLock(lock_dir() / f"gpu-{safe}.lock", f"the GPU {identity}" + (f" ({name})" if name else ""))

"""A grading run: what it grades (its roster), what it may skip (each result's key), how far it
got (the run file, rewritten after every result), and what keeps it apart from other runs and
leaves nothing behind (locks, a scratch folder of its own, the reaper).

A result is determined by its key: the submission folder's content, the cases, the grader's own
code, the policy values a verdict depends on (the precision budget, calibration), the device,
the limits and the sandbox. A rerun skips a submission whose result on disk has the same key, so
a run stopped in any way (Ctrl-C, kill -9, a power cut) resumes where it stopped: results are
written atomically, one per submission, the moment they are known.
"""

from __future__ import annotations

import dataclasses
import fcntl
import fnmatch
import functools
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from grader.common import config
from grader.isolation import procs
from grader.problem import BASELINES
from grader.course.locks import LockHeld, command_line, folder_lock, gpu_identity, gpu_lock
from grader.course.results import (RUN_FILE, ResultUnreadable, SubmissionResult, key_digest, load_result,
                      path_for, write_json_atomic)
from grader.common.status import Status
from grader.course.submission import folder_digest
from grader.course.submission import json_digest

GRADER_DIR = config.GRADER_DIR
SCRATCH_ENV = "GRADER_SCRATCH_DIR"   # where the run's scratch folder goes (default: /dev/shm)
SCRATCH_PREFIX = "grader-run-"
OWNER_FILE = ".owner"                # in a scratch folder: flocked by the run that owns it
SCRATCH_NEED_BYTES = 8 << 30         # outputs are large: 512 MiB on the largest case
__all__ = ["LockHeld", "RunSession", "RunJournal", "Entry", "plan_run", "scratch_dir"]


# ---------------------------------------------------------------- keys


# Modules that render, export or keep the books, and decide no result: a change to them
# re-renders the pages but regrades nothing.
# Paths below grader/, as fnmatch patterns. The hints are part of a result (its message), so
# report/hints*.py is kept in.
NOT_IN_RESULTS = ("report/*.py", "course/roster.py", "course/locks.py", "isolation/reaper.py",
                  "executors/*.py", "course/review.py", "cli/*.py")
IN_RESULTS_ANYWAY = ("report/hints*.py",)


def _decides_results(relative: str) -> bool:
    if any(fnmatch.fnmatch(relative, p) for p in IN_RESULTS_ANYWAY):
        return True
    return not any(fnmatch.fnmatch(relative, p) for p in NOT_IN_RESULTS)


@functools.lru_cache(maxsize=None)
def grader_version() -> str:
    """A digest of the grader's code that decides results (every .py under grader/, the checker
    and the subject included, but NOT_IN_RESULTS): any change to it regrades everything."""
    h = hashlib.sha256()
    for path in sorted(GRADER_DIR.rglob("*.py")):
        if "__pycache__" in path.parts or not _decides_results(path.relative_to(GRADER_DIR).as_posix()):
            continue
        h.update(str(path.relative_to(GRADER_DIR)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def context_key(ctx) -> dict[str, str]:
    """The parts of every key that do not depend on the submission (a GradeContext)."""
    d = ctx.device
    device = dict(cuda=d.cuda, name=d.name, capability=d.capability, arch=d.arch, driver=d.driver,
                  torch=d.torch_version, cuda_version=d.cuda_version, nvcc=d.nvcc, python=d.python)
    return dict(cases=json_digest([c.to_dict() for c in ctx.cases]), grader=grader_version(),
                policy=json_digest(dict(precision=list(ctx.precision), calibration=ctx.calibration)),
                device=json_digest(device), limits=json_digest(dataclasses.asdict(ctx.limits)),
                sandbox=json_digest(ctx.sandbox.describe()))


def key_changes(old: tuple, new: tuple) -> list[str]:
    """The parts of a key that differ: ['source', 'grader']."""
    old, new = dict(old), dict(new)
    return sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))


def reusable(result: SubmissionResult) -> bool:
    """A result a rerun may keep: not one where the grading machine or the grader itself failed
    (those are tried again)."""
    return result.status not in (Status.ENVIRONMENT_ERROR, Status.NO_RESULT) and not result.message.startswith("grader error")


# ---------------------------------------------------------------- the plan


@dataclasses.dataclass
class Entry:
    """One line of the run's roster: a submission or a baseline, and what this run does with it."""
    id: str
    role: str
    kind: str
    label: str
    path: Path                       # its result file
    key: tuple[tuple[str, str], ...]
    action: str                      # 'grade', 'skip' (unchanged) or 'keep' (not in --only)
    existing: SubmissionResult | None = None
    why: str = ""                    # why it is regraded, or why its result cannot be used
    sub: object = None               # the Submission; None for a PyTorch baseline
    gpu: str = ""                    # a baseline's copy timed on another GPU ('gpu1'; pipeline)

    def roster(self, out_dir: Path) -> dict:
        """Its line in the run file; a submission's names its folder, where the review queue
        (grader/course/review.py) reads the source an instructor decides on."""
        folder = getattr(self.sub, "path", None)
        return dict(id=self.id, role=self.role, kind=self.kind, label=self.label,
                    result=str(self.path.relative_to(out_dir)),
                    key=key_digest(self.key) if self.action != "keep" else None,
                    **(dict(gpu=self.gpu) if self.gpu else {}),
                    **(dict(folder=str(folder)) if folder is not None else {}))


def plan_run(subs, baselines: list[str], ctx, *, force: bool = False,
             only: set[str] | None = None, gpu_copies: tuple[str, ...] = ()) -> list[Entry]:
    """What this run does with each submission and baseline: grade it, skip it (its result has
    this run's key), or keep it (`only` names others). `gpu_copies` (a run on several GPUs):
    every baseline has an entry more for each, timed on that GPU (Entry.gpu)."""
    common = context_key(ctx)
    entries = []
    items = [(name, "baseline", "builtin", None, gpu) for name in baselines
             for gpu in ("", *gpu_copies)]
    items += [(s.id, s.role.value, s.kind.value, s, gpu) for s in subs
              for gpu in (("", *gpu_copies) if s.role.value == "baseline" else ("",))]
    for id, role, kind, sub, gpu in items:
        source = folder_digest(sub.path) if sub is not None else json_digest(["builtin", id])
        key = tuple(sorted({**common, "source": source}.items()))
        path = path_for(ctx.out_dir, id, role, gpu)
        label = BASELINES[id].label if sub is None else \
            ("Reference solution" if role == "baseline" else id)
        existing, why = None, ""
        try:
            existing = load_result(path)
        except ResultUnreadable as e:
            why = "" if str(e) == "no such file" else f"its result was unreadable: {e}"
        if only is not None and id not in only:
            action = "keep"
        elif force or only is not None or existing is None:
            action = "grade"
        elif existing.key != key:
            action = "grade"
            changes = key_changes(existing.key, key)
            why = (f"{', '.join(changes)} changed" if existing.key else
                   "graded before results had keys")
        elif not reusable(existing):
            action, why = "grade", "the grading machine or the grader failed on it last time"
        else:
            action = "skip"
        entries.append(Entry(id, role, kind, label, path, key, action, existing, why, sub, gpu))
    return entries


def check_only(only: list[str] | None, ids: list[str]) -> str:
    """'' when every id of --only is one of this run's; else the error to print."""
    unknown = [i for i in (only or []) if i not in set(ids)]
    if not unknown:
        return ""
    shown = ", ".join(ids[:20]) + (f", ... ({len(ids)} in all)" if len(ids) > 20 else "")
    return (f"--only: no submission named {', '.join(repr(u) for u in unknown)} in this run; "
            f"the submissions are: {shown or 'none'}")


# ---------------------------------------------------------------- the run file


class RunJournal:
    """The run file, kept current: the roster with each entry's key, the state ('running',
    'finished', 'interrupted', 'stopped') and the counts so far; rewritten atomically after
    every result, so a killed run's file says how far it got."""

    def __init__(self, out_dir: Path, run: dict):
        self.out_dir, self.run = out_dir, run
        run.update(state="running", pid=os.getpid(), host=socket.gethostname(),
                   command=command_line(),
                   progress=dict(graded=0, skipped=0, kept=0, total=len(run.get("submissions", []))))
        self.write()

    def plan(self, entries: list[Entry]) -> None:
        self.run["roster"] = [e.roster(self.out_dir) for e in entries]
        self.run["progress"]["total"] = len(entries)
        self.write()

    def record(self, how: str) -> None:
        """`how`: 'graded', 'skipped' or 'kept'."""
        self.run["progress"][how] += 1
        self.write()

    def finish(self, state: str) -> None:
        self.run["state"] = state
        self.write()

    def write(self) -> None:
        write_json_atomic(self.out_dir / RUN_FILE, self.run)


def previous_run_note(out_dir: Path) -> str:
    """What the run file says of an earlier run that did not finish, or ''."""
    try:
        run = json.loads((out_dir / RUN_FILE).read_text())
    except (OSError, ValueError):
        return ""
    if not isinstance(run, dict) or run.get("state") not in ("running", "interrupted"):
        return ""
    p = run.get("progress") or {}
    how = "was interrupted" if run["state"] == "interrupted" else "did not finish (killed?)"
    return (f"the previous run (started {run.get('started_at', '?')}, pid {run.get('pid', '?')}) "
            f"{how} after {p.get('graded', 0)} graded and {p.get('skipped', 0)} skipped of "
            f"{p.get('total', '?')}; resuming: what it finished is kept")


# ---------------------------------------------------------------- scratch space

_SCRATCH: Path | None = None   # the current run's scratch folder


def scratch_base(need_bytes: int = SCRATCH_NEED_BYTES) -> Path:
    """Where scratch folders go: $GRADER_SCRATCH_DIR, else /dev/shm where it has room (it is
    often a small tmpfs in containers), else the default temporary folder."""
    if os.environ.get(SCRATCH_ENV):
        return Path(os.environ[SCRATCH_ENV])
    try:
        st = os.statvfs("/dev/shm")
        if os.access("/dev/shm", os.W_OK) and st.f_bavail * st.f_frsize >= need_bytes:
            return Path("/dev/shm")
    except OSError:
        pass
    return Path(tempfile.gettempdir())


def scratch_dir(need_bytes: int = SCRATCH_NEED_BYTES) -> str | None:
    """The folder temporary work goes in: the run's own (removed when the run ends, however it
    ends), else (outside a run: a benchmark, a test) where scratch_base says, or None (the
    default temporary folder)."""
    if _SCRATCH is not None and _SCRATCH.is_dir():
        return str(_SCRATCH)
    base = scratch_base(need_bytes)
    return str(base) if os.environ.get(SCRATCH_ENV) or str(base) == "/dev/shm" else None


def clean_stale_scratch(bases: list[Path], *, min_age_s: float = 600) -> list[Path]:
    """Remove the scratch folders of runs that are no longer alive (their owner file is not
    locked; one with no owner file only when older than `min_age_s`). Returns what went."""
    removed = []
    for base in dict.fromkeys(bases):
        for folder in sorted(base.glob(SCRATCH_PREFIX + "*")) if base.is_dir() else ():
            owner = folder / OWNER_FILE
            try:
                fd = os.open(owner, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                try:
                    if time.time() - folder.stat().st_mtime < min_age_s:
                        continue
                except OSError:
                    continue
            except OSError:
                continue
            else:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    os.close(fd)
                    continue   # its run is alive
                os.close(fd)
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


# ---------------------------------------------------------------- the session


WORKERS_FILE = ".grader.workers"   # in a results folder: the token of the run its workers serve


def admitted(out_dir: Path) -> str:
    """The token of the run whose workers may grade into `out_dir` (written by that run, under the
    folder's lock: grader/executors/slurm.py), or ''."""
    try:
        token = json.loads((Path(out_dir) / WORKERS_FILE).read_text()).get("token")
    except (OSError, ValueError, AttributeError):
        return ""
    return token if isinstance(token, str) else ""


class RunSession:
    """Everything a run holds while it grades, released when it ends: the results folder's lock
    and the GPU's, a scratch folder of its own, the reaper that cleans up after a kill -9, and a
    SIGTERM/SIGHUP that stop the run as Ctrl-C does."""

    def __init__(self, out_dir: Path, *, device, worker_of: str | None = None, gpus=()):
        self.out_dir, self.device = Path(out_dir), device
        # A worker of the run that holds the folder's lock (grader/executors/slurm.py) takes no folder lock
        # and cleans nothing in the folder; it opens only while the folder admits `worker_of`.
        self.worker_of = worker_of
        self.locks = [] if worker_of else [folder_lock(self.out_dir)]
        if device.cuda and gpus:   # one lock per GPU of the run's set (their UUIDs)
            self.locks += [gpu_lock(g.uuid or f"index{g.index}", g.name) for g in gpus]
        elif device.cuda:
            self.locks.append(gpu_lock(gpu_identity(), device.name))
        self.token = secrets.token_hex(8)
        self.scratch: Path | None = None
        self.reaper: subprocess.Popen | None = None
        self.notes: list[str] = []
        self._owner_fd: int | None = None
        self._signals: dict = {}

    def open(self) -> "RunSession":
        """Take the locks (LockHeld if another run holds one), then set up scratch and reaper."""
        global _SCRATCH
        if self.worker_of and admitted(self.out_dir) != self.worker_of:
            raise LockHeld(f"{self.out_dir} admits no worker of run {self.worker_of}: that run has "
                           f"ended, or another run holds the folder")
        taken = []
        try:
            for lock in self.locks:
                note = lock.acquire()
                taken.append(lock)
                if note:
                    self.notes.append(note)
        except LockHeld:
            for lock in taken:
                lock.release()
            raise
        # Only the folders this run writes: another run (`check`) may be writing in a subfolder.
        half = [] if self.worker_of else [p for folder in (self.out_dir, self.out_dir / "baselines")
                                          for p in folder.glob(".*.tmp") if p.is_file()]
        for path in half:   # a write a killed run never finished (the lock says none is running)
            path.unlink(missing_ok=True)
        if half:
            self.notes.append(f"removed {len(half)} half-written file(s) a killed run left in "
                              f"{self.out_dir}")
        base = scratch_base()
        removed = clean_stale_scratch([base, Path("/dev/shm"), Path(tempfile.gettempdir())])
        if removed:
            self.notes.append(f"removed {len(removed)} scratch folder(s) of runs that were killed: "
                              + ", ".join(str(p) for p in removed[:5]))
        base.mkdir(parents=True, exist_ok=True)
        self.scratch = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{self.token}-", dir=base))
        self._owner_fd = os.open(self.scratch / OWNER_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._owner_fd, fcntl.LOCK_EX)
        _SCRATCH = self.scratch
        env = {k: v for k, v in os.environ.items() if k != procs.RUN_TOKEN_ENV}
        self.reaper = subprocess.Popen([sys.executable, "-m", "grader.isolation.reaper", self.token,
                                        str(self.scratch)], stdin=subprocess.PIPE,
                                       cwd=str(GRADER_DIR.parent), env=env, start_new_session=True)
        procs.start_run(self.token, self._tell_reaper)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                if signal.getsignal(sig) is not signal.SIG_IGN:   # under nohup a hangup stays ignored
                    self._signals[sig] = signal.signal(sig, _stop)
            except ValueError:   # not the main thread: Ctrl-C is the caller's to handle
                break
        return self

    def _tell_reaper(self, op: str, pgid: int) -> None:
        try:
            self.reaper.stdin.write(f"{op}{pgid}\n".encode())
            self.reaper.stdin.flush()
        except (OSError, ValueError):
            pass   # the reaper is gone: the children still die with us (PR_SET_PDEATHSIG)

    def close(self) -> None:
        """Kill what is left, let the reaper sweep and remove the scratch, release the locks."""
        global _SCRATCH
        for sig, handler in self._signals.items():
            signal.signal(sig, handler)
        procs.cancel_all()
        procs.end_run()
        if self.reaper is not None:
            try:
                self.reaper.stdin.close()
                self.reaper.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.reaper.kill()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
        if self._owner_fd is not None:
            os.close(self._owner_fd)
        _SCRATCH = None
        for lock in reversed(self.locks):
            lock.release()

    def __enter__(self) -> "RunSession":
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()


def _stop(signum, frame) -> None:
    """SIGTERM or SIGHUP: stop as Ctrl-C does (queued work cancelled, what is done kept)."""
    raise KeyboardInterrupt(signal.Signals(signum).name)

"""The service's store (issue 33): one SQLite file in the store folder, `service.sqlite3`, and
each accepted upload under `uploads/`.

What it keeps, and the invariant each part holds:
- **tokens**: a token's SHA-256, never the token, with its roster folder (or the instructor's
  role), when it was issued and when revoked. A revoked or unknown token identifies nobody.
- **submissions**: each accepted upload's id, student, kind (`check`: public cases, not ranked;
  `submission`: everything, ranked), size and digest, its place in the queue (queued, running,
  done), and its result's JSON once graded. An upload is accepted only once its file is on disk
  and its row committed (WAL, synchronous FULL): a kill -9 after that loses nothing, and on the
  next start every job left `running` is queued again (recover). A file with no row (killed
  between the two) is removed then, since its student was never told it was accepted.
- **the queue** is fair across students: the next job is the oldest queued one of the student
  whose last job started longest ago (round robin by student), so one student's fifty uploads
  wait behind everyone else's one.
- **audit**: every attempt, accepted or refused, with who, what, why and from where.
- **one service per store**: an exclusive lock on `service.lock` (released by the kernel when its
  holder dies, so a kill -9 leaves nothing stale); a second service is refused with the holder's
  pid.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import hashlib
import os
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

DB_FILE = "service.sqlite3"
LOCK_FILE = "service.lock"
UPLOADS = "uploads"
KINDS = ("check", "submission")
STATES = ("queued", "running", "done")

SCHEMA = """
CREATE TABLE IF NOT EXISTS tokens (
    digest TEXT PRIMARY KEY,
    folder TEXT NOT NULL,
    role TEXT NOT NULL CHECK (role IN ('student', 'instructor')),
    issued_at TEXT NOT NULL,
    revoked_at TEXT);
CREATE INDEX IF NOT EXISTS tokens_by_folder ON tokens(folder, role);
CREATE TABLE IF NOT EXISTS submissions (
    id TEXT PRIMARY KEY,
    folder TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('check', 'submission')),
    state TEXT NOT NULL CHECK (state IN ('queued', 'running', 'done')),
    received_at TEXT NOT NULL,
    started_at TEXT,
    finished_at TEXT,
    upload_bytes INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    result TEXT);
CREATE INDEX IF NOT EXISTS submissions_by_state ON submissions(state, received_at);
CREATE INDEX IF NOT EXISTS submissions_by_folder ON submissions(folder, kind, received_at);
CREATE TABLE IF NOT EXISTS audit (
    n INTEGER PRIMARY KEY AUTOINCREMENT,
    at TEXT NOT NULL,
    folder TEXT NOT NULL,
    action TEXT NOT NULL,
    outcome TEXT NOT NULL,
    detail TEXT NOT NULL,
    remote TEXT NOT NULL);
"""


class StoreBusy(RuntimeError):
    """Another service holds this store folder: the message names the folder, its pid and the fix."""


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds")


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


@dataclasses.dataclass(frozen=True)
class Identity:
    """Who a token is: a roster folder (a student) or the instructor (folder '')."""
    folder: str
    role: str

    @property
    def instructor(self) -> bool:
        return self.role == "instructor"


@dataclasses.dataclass(frozen=True)
class Job:
    """One accepted upload, as the store has it."""
    id: str
    folder: str
    kind: str
    state: str
    received_at: str
    upload: Path
    attempts: int = 0
    result: str | None = None


class Store:
    """The store folder, opened by one service at a time (`lock`), or read by anyone (grading
    over the store, tests). Every method is one transaction; the connection is shared by the
    service's threads behind one lock."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / UPLOADS).mkdir(exist_ok=True)
        self._lock_fd: int | None = None
        self._mutex = threading.Lock()
        self._db = sqlite3.connect(self.folder / DB_FILE, isolation_level=None,
                                   check_same_thread=False, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)

    # ------------------------------------------------------------------ one service per store

    def lock(self) -> None:
        """Hold the store for this process, or raise StoreBusy naming the process that does."""
        path = self.folder / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StoreBusy(f"{self.folder}: another service (pid {holder}) is using this store; "
                            f"stop it first, or give this one a store folder of its own (--store)")
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd = fd

    def close(self) -> None:
        with self._mutex:
            self._db.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)   # the kernel lets the lock go with it
            self._lock_fd = None

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken at once (BEGIN IMMEDIATE): committed whole or not at all."""
        with self._mutex:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _read(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._mutex:
            return self._db.execute(sql, args).fetchall()

    # ------------------------------------------------------------------ tokens

    def add_token(self, token: str, folder: str, role: str = "student") -> None:
        with self._write() as db:
            db.execute("INSERT INTO tokens VALUES (?, ?, ?, ?, NULL)",
                       (digest(token), folder, role, now()))

    def revoke(self, folder: str, role: str = "student") -> int:
        """Revoke every live token of `folder` (or the instructor's); how many were live."""
        with self._write() as db:
            return db.execute("UPDATE tokens SET revoked_at = ? WHERE folder = ? AND role = ? "
                              "AND revoked_at IS NULL", (now(), folder, role)).rowcount

    def identify(self, token: str) -> tuple[Identity | None, str]:
        """(who the token is, '') or (None, why not: 'unknown' or 'revoked')."""
        rows = self._read("SELECT folder, role, revoked_at FROM tokens WHERE digest = ?",
                          (digest(token),))
        if not rows:
            return None, "unknown"
        folder, role, revoked = rows[0]
        return (None, "revoked") if revoked else (Identity(folder, role), "")

    def live_folders(self) -> set[str]:
        return {r[0] for r in self._read("SELECT folder FROM tokens WHERE role = 'student' "
                                         "AND revoked_at IS NULL")}

    # ------------------------------------------------------------------ submissions and the queue

    def accept(self, folder: str, kind: str, data: bytes) -> Job:
        """Keep an upload: its file written whole and synced under uploads/, then its row
        committed. Returns its Job (queued)."""
        if kind not in KINDS:
            raise ValueError(f"kind {kind!r}: one of {', '.join(KINDS)}")
        job_id = uuid.uuid4().hex
        path = self.folder / UPLOADS / job_id
        tmp = path.with_suffix(".part")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        received = now()
        with self._write() as db:
            db.execute("INSERT INTO submissions (id, folder, kind, state, received_at, "
                       "upload_bytes, sha256) VALUES (?, ?, ?, 'queued', ?, ?, ?)",
                       (job_id, folder, kind, received, len(data), hashlib.sha256(data).hexdigest()))
        return Job(job_id, folder, kind, "queued", received, path)

    def job(self, job_id: str) -> Job | None:
        rows = self._read("SELECT id, folder, kind, state, received_at, attempts, result "
                          "FROM submissions WHERE id = ?", (job_id,))
        return self._job(rows[0]) if rows else None

    def jobs_of(self, folder: str) -> list[Job]:
        rows = self._read("SELECT id, folder, kind, state, received_at, attempts, result "
                          "FROM submissions WHERE folder = ? ORDER BY received_at", (folder,))
        return [self._job(r) for r in rows]

    def _job(self, row: tuple) -> Job:
        job_id, folder, kind, state, received, attempts, result = row
        return Job(job_id, folder, kind, state, received, self.folder / UPLOADS / job_id,
                   attempts, result)

    def count_since(self, folder: str, kind: str, since: str) -> tuple[int, str | None]:
        """How many `kind` uploads `folder` had accepted since `since` (ISO time), and when the
        first of them was (None if none): the rate limits, and when one comes free."""
        count, first = self._read("SELECT COUNT(*), MIN(received_at) FROM submissions WHERE "
                                  "folder = ? AND kind = ? AND received_at >= ?",
                                  (folder, kind, since))[0]
        return count, first

    def queue_order(self) -> list[str]:
        """The queued jobs' ids in the order the queue gives them (round robin by student)."""
        with self._mutex:
            return _queue_order(self._db)

    def position(self, job_id: str) -> int | None:
        """1 for the next job to run; None when it is not queued."""
        order = self.queue_order()
        return order.index(job_id) + 1 if job_id in order else None

    def take(self) -> Job | None:
        """The next job, marked running (one more attempt), or None when none is queued."""
        with self._write() as db:
            order = _queue_order(db)
            if not order:
                return None
            db.execute("UPDATE submissions SET state = 'running', started_at = ?, "
                       "attempts = attempts + 1 WHERE id = ?", (now(), order[0]))
            row = db.execute("SELECT id, folder, kind, state, received_at, attempts, result "
                             "FROM submissions WHERE id = ?", (order[0],)).fetchone()
        return self._job(row)

    def take_batch(self, limit: int) -> list[Job]:
        """Up to `limit` jobs for one grading run, marked running (one more attempt each): the
        queue's next job, then, in queue order, every later one of the same kind from a student
        not yet in the batch. The jobs passed over keep their places: a check queued between two
        submissions does not cut the submissions' batch short, and goes in the next one. A job
        whose run failed before (an attempt counted) is graded alone, and never joins a batch:
        one submission that breaks its run cannot use up the attempts of the others with it."""
        with self._write() as db:
            order = _queue_order(db)
            if not order:
                return []
            queued = {r[0]: (r[1], r[2], r[3]) for r in db.execute(
                "SELECT id, kind, folder, attempts FROM submissions WHERE state = 'queued'")}
            kind, _, tried = queued[order[0]]
            chosen, students = [], set()
            for job_id in order[:1] if tried else order:
                job_kind, folder, attempts = queued[job_id]
                if job_kind == kind and folder not in students and len(chosen) < limit and \
                        (not attempts or job_id == order[0]):
                    chosen.append(job_id)
                    students.add(folder)
            started = now()
            db.executemany("UPDATE submissions SET state = 'running', started_at = ?, "
                           "attempts = attempts + 1 WHERE id = ?", [(started, j) for j in chosen])
            rows = {r[0]: r for r in db.execute(
                "SELECT id, folder, kind, state, received_at, attempts, result FROM submissions "
                f"WHERE id IN ({','.join('?' * len(chosen))})", chosen)}
        return [self._job(rows[j]) for j in chosen]

    def finish(self, job_id: str, result_json: str) -> None:
        with self._write() as db:
            db.execute("UPDATE submissions SET state = 'done', finished_at = ?, result = ? "
                       "WHERE id = ?", (now(), result_json, job_id))

    def requeue(self, job_id: str, *, count_attempt: bool = True) -> None:
        """A running job back in the queue: its grading failed (the attempt counts), or the
        service stopped mid-grade or the job was given back untried (`count_attempt=False`: not
        the job's fault, and its student keeps their turn in the round robin)."""
        with self._write() as db:
            if count_attempt:
                db.execute("UPDATE submissions SET state = 'queued' WHERE id = ? AND "
                           "state = 'running'", (job_id,))
            else:
                db.execute("UPDATE submissions SET state = 'queued', attempts = attempts - 1, "
                           "started_at = NULL WHERE id = ? AND state = 'running'", (job_id,))

    def recover(self) -> list[str]:
        """At a service's start: every job left running is queued again, and every upload file
        with no row (its service killed before it said "accepted") is removed. The ids requeued."""
        with self._write() as db:
            running = [r[0] for r in db.execute("SELECT id FROM submissions WHERE state = 'running'")]
            db.execute("UPDATE submissions SET state = 'queued' WHERE state = 'running'")
            known = {r[0] for r in db.execute("SELECT id FROM submissions")}
        for path in (self.folder / UPLOADS).iterdir():
            if path.name not in known:
                path.unlink(missing_ok=True)
        return running

    # ------------------------------------------------------------------ audit

    def audit(self, folder: str, action: str, outcome: str, detail: str = "",
              remote: str = "") -> None:
        with self._write() as db:
            db.execute("INSERT INTO audit (at, folder, action, outcome, detail, remote) "
                       "VALUES (?, ?, ?, ?, ?, ?)", (now(), folder, action, outcome, detail[:2000],
                                                     remote))

    def audit_log(self, limit: int = 1000) -> list[tuple]:
        return self._read("SELECT at, folder, action, outcome, detail, remote FROM audit "
                          "ORDER BY n DESC LIMIT ?", (limit,))


def _queue_order(db: sqlite3.Connection) -> list[str]:
    """The queued jobs in round-robin order, read in `db`'s current transaction."""
    queued = db.execute("SELECT id, folder FROM submissions WHERE state = 'queued' "
                        "ORDER BY received_at, id").fetchall()
    last = dict(db.execute("SELECT folder, MAX(started_at) FROM submissions "
                           "WHERE started_at IS NOT NULL GROUP BY folder").fetchall())
    return round_robin(queued, last)


def round_robin(queued: list[tuple[str, str]], last_start: dict[str, str]) -> list[str]:
    """The order the queue runs `queued` ((id, folder), oldest first): each turn, the oldest job of
    the student whose last job started longest ago (never started first; ties: whose oldest job
    came first). One student's many uploads interleave with everyone else's."""
    by_folder: dict[str, list[str]] = {}
    for job_id, folder in queued:
        by_folder.setdefault(folder, []).append(job_id)
    first_seen = {folder: i for i, folder in enumerate(by_folder)}
    turn = {folder: last_start.get(folder) or "" for folder in by_folder}
    order, step = [], 0
    while by_folder:
        folder = min(by_folder, key=lambda f: (turn[f], first_seen[f]))
        order.append(by_folder[folder].pop(0))
        step += 1
        turn[folder] = f"~{step:012d}"   # after every real start time: it had its turn now
        if not by_folder[folder]:
            del by_folder[folder]
    return order

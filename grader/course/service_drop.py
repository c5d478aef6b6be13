"""The check service's store as a course drop (issue 33, "one truth"): `make grade SUBMISSIONS=<store
folder>` grades each student's counted upload as if an LMS had delivered it.

What it guarantees:
- **the store is only read**: its SQLite file is opened read-only (`mode=ro`), so a grading run
  may read the store of a running service, and never changes what the service keeps. The file and
  folder names are the store's (grader/service/store.py DB_FILE, UPLOADS; a test holds them equal:
  grader.course sits below grader.service and does not import it).
- **which upload counts** is one function, `counted`: checks never count; "last" is a student's latest accepted submission (by the time the service received it),
  graded yet or not; "best" is the one whose stored result is ranked (it passed every case and
  has a time: SubmissionResult.ranked) with the fastest median, ties to the earlier, else the last
  (none ranked, or none graded yet). The live board (grader/service/pages.py counted_job) picks
  `best` the same way; it shows only finished ones, so its `last` is the latest graded.
  With grading.toml [service] deadline set, an upload received after it is never counted, and
  each is listed as skipped.
- **the same folders as a drop**: the counted upload is checked against the digest the service
  recorded when it accepted it, then unpacked by the drop's own rules (archives.unpack,
  config.STUDENT_ARCHIVE) into the run's drop folder, `service/<roster folder>/`, its submission
  at the root or in its one top folder (submission_root, the rule the service accepted it by).
  A counted upload that is missing, damaged or breaks a rule is that student's INVALID submission
  with `machine_fault` (environment_error: the store's fault, no grade), whose row says what
  happened and what to do; the other students are graded all the same.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import shutil
import sqlite3
from pathlib import Path

from grader.common import config
from grader.course.archives import ArchiveRejected, _slug, unpack
from grader.course.policy import Policy
from grader.course.results import SubmissionResult
from grader.course.student_entries import Skipped
from grader.course.submission import NotRegular, Kind, Submission, inspect_folder, read_regular

DB_FILE = "service.sqlite3"   # grader/service/store.py DB_FILE
UPLOADS = "uploads"           # grader/service/store.py UPLOADS
SCRATCH = "service"           # under the run's drop folder (config.DROP_SCRATCH)
COUNTS = ("best", "last")
ZIP_MAGIC = b"PK\x03\x04"     # an upload is a .zip or a gzip'd tar, told by its first bytes
GZIP_MAGIC = b"\x1f\x8b"


class StoreUnreadable(ValueError):
    """The store folder's database cannot be read: the message names it and what to do."""


@dataclasses.dataclass(frozen=True)
class StoredSubmission:
    """One ranked upload (kind `submission`) as the store has it; `result` once graded and
    readable."""
    id: str
    folder: str                     # the student's roster folder
    state: str                      # queued, running or done
    received_at: datetime.datetime
    upload: Path
    upload_bytes: int
    sha256: str
    result: SubmissionResult | None = None


@dataclasses.dataclass(frozen=True)
class ServiceDrop:
    """What grading over a store reads: one submission per student, the uploads left out, and the
    one-line summary a run prints."""
    root: Path
    counts: str
    submissions: tuple[Submission, ...]   # sorted by id (the roster folder)
    chosen: dict[str, StoredSubmission]   # folder -> the upload counted
    skipped: tuple[Skipped, ...]
    summary: str


def is_store(path: Path) -> bool:
    """Whether `path` is a service's store folder (it holds the store's database)."""
    return Path(path).is_dir() and (Path(path) / DB_FILE).is_file()


def submission_root(folder: Path) -> Path:
    """The folder itself, or its one top folder when that is all it holds (a zipped folder)."""
    entries = list(folder.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink():
        return entries[0]
    return folder


# ---------------------------------------------------------------- which upload counts


def counted(uploads: list[StoredSubmission], counts: str) -> StoredSubmission | None:
    """The upload of one student that counts under `counts` ('best' or 'last'); None if none.
    'last': the latest received, graded or not. 'best': the fastest ranked one (its stored result
    passed every case and has a time; ties to the earlier), else the last."""
    if counts not in COUNTS:
        raise ValueError(f"grading.toml [service] counts = {counts!r}: one of {', '.join(COUNTS)}")
    if not uploads:
        return None
    order = sorted(uploads, key=lambda u: (u.received_at, u.id))
    if counts == "best":
        best = fastest([u for u in order if u.state == "done" and u.result is not None],
                       lambda u: u.result)
        if best is not None:
            return best
    return order[-1]


def fastest(oldest_first: list, result_of):
    """The best of one student's graded submissions (oldest first): the fastest whose result is
    ranked (passed every case, has a time), the earlier of a tie; None when none is ranked. The
    one rule for 'best', here and on the live page (grader/service/pages.py)."""
    ranked = [item for item in oldest_first if result_of(item).ranked]
    return min(ranked, key=lambda item: result_of(item).timing.median_ms) if ranked else None


# ---------------------------------------------------------------- reading the store


def read_store(store: Path) -> list[StoredSubmission]:
    """Every ranked upload in the store, oldest first; the database opened read-only."""
    db_path = Path(store).absolute() / DB_FILE
    try:
        db = sqlite3.connect(f"{db_path.as_uri()}?mode=ro", uri=True, timeout=30)
        try:
            rows = db.execute("SELECT id, folder, state, received_at, upload_bytes, sha256, result "
                              "FROM submissions WHERE kind = 'submission' "
                              "ORDER BY received_at, id").fetchall()
        finally:
            db.close()
    except sqlite3.Error as e:
        raise StoreUnreadable(f"{db_path}: cannot be read as a service store ({e}). Pass the folder "
                              f"`python -m grader serve --store` was given, or restore it from "
                              f"its backup") from None
    return [StoredSubmission(id=job_id, folder=folder, state=state,
                             received_at=_when(received, db_path, job_id),
                             upload=db_path.parent / UPLOADS / job_id, upload_bytes=size,
                             sha256=digest, result=_result(result))
            for job_id, folder, state, received, size, digest, result in rows]


def _when(text: str, db_path: Path, job_id: str) -> datetime.datetime:
    try:
        when = datetime.datetime.fromisoformat(text)
    except (TypeError, ValueError):
        raise StoreUnreadable(f"{db_path}: submission {job_id} has received_at {text!r}, not a "
                              f"date and time; the store was edited by hand or is damaged: "
                              f"restore it from its backup") from None
    return when if when.tzinfo else when.replace(tzinfo=datetime.timezone.utc)


def _result(text: str | None) -> SubmissionResult | None:
    """A stored result, or None when there is none or it cannot be read (never ranked then)."""
    if not text:
        return None
    try:
        return SubmissionResult.from_dict(json.loads(text))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


# ---------------------------------------------------------------- the drop


def open_service_drop(store: Path, *, scratch: Path, policy: Policy,
                      limits: config.ArchiveLimits = config.STUDENT_ARCHIVE) -> ServiceDrop:
    """Each student's counted upload (policy.service_counts) unpacked under `scratch`/service/ as
    a Submission, the uploads not counted for the deadline listed as Skipped."""
    store = Path(store)
    uploads = read_store(store)
    deadline = policy.service_deadline
    skipped: list[Skipped] = []
    by_folder: dict[str, list[StoredSubmission]] = {}
    for u in uploads:
        if deadline is not None and u.received_at > deadline:
            skipped.append(Skipped(f"{UPLOADS}/{u.id}", (
                f"{u.folder}'s submission received {u.received_at.isoformat(timespec='seconds')}, "
                f"after the deadline {deadline.isoformat()} (grading.toml [service] deadline): "
                f"not counted")))
            continue
        by_folder.setdefault(u.folder, []).append(u)
    dest_root = Path(scratch) / SCRATCH
    if dest_root.exists():   # the drop lock is held: no other run reads these folders now
        shutil.rmtree(dest_root)
    dest_root.mkdir(parents=True)
    chosen: dict[str, StoredSubmission] = {}
    subs: list[Submission] = []
    for folder, mine in sorted(by_folder.items()):
        pick = counted(mine, policy.service_counts)
        chosen[folder] = pick
        subs.append(submission_from_store(pick, dest_root / _folder_name(folder), limits))
    unusable = sum(1 for s in subs if s.kind is Kind.INVALID)
    return ServiceDrop(store, policy.service_counts, tuple(subs), chosen, tuple(skipped),
                       _summary(store, len(subs), policy.service_counts, skipped, unusable))


def submission_from_store(upload: StoredSubmission, dest: Path,
                          limits: config.ArchiveLimits) -> Submission:
    """The student's submission from their stored upload, unpacked into `dest`; an INVALID one
    whose problem says what is wrong when the upload is missing, damaged or breaks a rule."""
    received = upload.received_at.isoformat(timespec="seconds")
    what = f"your submission {upload.id[:12]} (received {received})"
    where = f"{UPLOADS}/{upload.id}"   # never the server's own path: students read this
    try:
        data = read_regular(upload.upload, limits.max_bytes)
    except FileNotFoundError:
        return _unusable(upload, f"{what} is missing from the service's store. It was accepted, "
                                 f"so this is the service's fault, not yours: the instructor "
                                 f"restores {where} from the store's backup, or asks you to submit "
                                 f"again")
    except (NotRegular, OSError) as e:
        why = e.what if isinstance(e, NotRegular) else e.strerror or type(e).__name__
        return _unusable(upload, f"{what} cannot be read from the service's store ({why}); this "
                                 f"is the service's fault, not yours: the instructor restores "
                                 f"{where} from the store's backup")
    if len(data) != upload.upload_bytes or hashlib.sha256(data).hexdigest() != upload.sha256:
        return _unusable(upload, f"{what} is damaged in the service's store: its file no longer "
                                 f"matches the digest recorded when it was accepted. This is the "
                                 f"service's fault, not yours: the instructor restores {where} from "
                                 f"the store's backup, or asks you to submit again")
    suffix = ".zip" if data.startswith(ZIP_MAGIC) else ".tar.gz" if data.startswith(GZIP_MAGIC) else None
    if suffix is None:
        return _unusable(upload, f"{what} is not a .zip or .tar.gz; submit again with make submit")
    dest.parent.mkdir(parents=True, exist_ok=True)
    archive = dest.parent / f".{dest.name}{suffix}"
    archive.write_bytes(data)
    try:
        unpack(archive, dest, limits)
    except ArchiveRejected as e:
        return _unusable(upload, f"{what}: the archive {e}. Nothing of it was graded; submit "
                                 f"your folder again with make submit")
    finally:
        archive.unlink(missing_ok=True)
    return inspect_folder(submission_root(dest), id=upload.folder)


def _unusable(upload: StoredSubmission, problem: str) -> Submission:
    return Submission(upload.folder, upload.upload.absolute(), Kind.INVALID, problem=problem + ".",
                      machine_fault=True)


def _folder_name(folder: str) -> str:
    """The roster folder as a folder name, unless it cannot be one on its own (then a slug)."""
    plain = folder not in ("", ".", "..") and "/" not in folder and "\x00" not in folder \
        and len(folder.encode("utf-8", "surrogatepass")) <= 200
    return folder if plain else _slug(folder)


def _summary(store: Path, students: int, counts: str, skipped: list[Skipped], unusable: int) -> str:
    line = (f"{students} student(s) from the service store {store}, each one's "
            f"{'best' if counts == 'best' else 'last'} submission counted "
            f"(grading.toml [service] counts = \"{counts}\")")
    line += f"; {len(skipped)} upload(s) skipped, received after the deadline" if skipped else \
        "; 0 uploads skipped"
    if unusable:
        line += f"; {unusable} student(s)' counted upload unusable (their rows say why)"
    return line

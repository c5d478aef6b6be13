"""The review queue and the instructor's decisions (issue 30).

The grader ranks only what it can account for. A submission whose code the audit cannot account
for gets `review` (Status.REVIEW: not ranked, no performance points, not a cheating verdict), and
what the audit cannot see at all is left to a person: the instructors' page lists every `review`
result, the top N ranked (`[review] top` in grading.toml) and every ranked one at or faster than
a library baseline of the same run (SDPA's FLASH and cuDNN rows), each with why it is there, the
kernels its timed calls ran and where each is defined, the audit's findings and notes, and its
source. `python -m grader review` records a decision per submission in the results folder:

- `cleared`: a `review` result reads as `pass` (ranked with its measured time), with a note that
  says when and why; a cleared ranked result stays ranked, with the same note.
- `disqualified`: the result reads as `flagged`, its verdict "disqualified after an instructor's
  review: NOTE", never ranked.

Invariants:
- A decision holds for the source it was made on and no other: it records the result's source
  digest (`dict(result.key)["source"]`, the folder's content), and applies only while the result
  has that digest. A regrade of the same source keeps it; a changed source makes it stale: not
  applied, shown as stale, and the submission is back in the queue (`apply_decisions`).
- Decisions are applied in one place, where results are read for reporting (report.reported);
  the pages, grades.csv, the Canvas and Gradescope files, the feedback and the terminal table are
  all rendered from what it returns, never each on its own.
- The queue, the audit's findings and the source are for instructors only: the students' page
  never shows them (report.render_leaderboard).
- Reading a submission's folder never blocks the grader: a folder holding anything but regular
  files, folders and links is not read (`read_source`).
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import fcntl
import json
import os
import stat
import textwrap
from pathlib import Path

from grader.common.status import Status
from grader.common.text import clean
from grader.course.results import SubmissionResult, write_json_atomic
from grader.course.submission import FILE_MARK, folder_digest, read_sources, split_sources

DECISIONS_FILE = "_review.json"     # in the results folder: every decision, in the order made
LOCK_FILE = ".review.lock"          # serialises two `review` commands writing at once
SCHEMA = 1
CLEARED, DISQUALIFIED = "cleared", "disqualified"
DECISIONS = (CLEARED, DISQUALIFIED)
# The library rows a ranked time is compared with: a student's kernel at their speed is worth a
# look (the held-out round of issue 30 ranked cuDNN's kernels as a student's own).
LIBRARY_BASELINES = ("sdpa_flash", "sdpa_cudnn")
SOURCE_SHOWN_CHARS = 64_000         # of a submission's source, on the page and in the terminal
NOTE_CHARS = 2_000


class ReviewError(ValueError):
    """The decisions file cannot be used, or a decision cannot be recorded: the message names
    the file or the submission, and the fix."""


# ---------------------------------------------------------------- decisions


@dataclasses.dataclass(frozen=True)
class Decision:
    """An instructor's decision on one submission's source."""
    id: str
    decision: str       # CLEARED or DISQUALIFIED
    note: str           # why, in the instructor's words (the student reads it)
    when: str           # ISO time it was made
    source: str         # the source digest it was made on: dict(result.key)["source"]
    by: str = ""        # who made it (the login of whoever ran the command)
    status: str = ""    # the status the grader had given that source

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d) -> "Decision":
        if not isinstance(d, dict):
            raise ValueError(f"a decision is a JSON object, not {type(d).__name__}")
        fields = {f.name for f in dataclasses.fields(cls)}
        missing = [k for k in ("id", "decision", "note", "when", "source") if k not in d]
        if missing:
            raise ValueError(f"a decision lacks {', '.join(missing)}")
        if d["decision"] not in DECISIONS:
            raise ValueError(f"decision {d['decision']!r} is not one of {', '.join(DECISIONS)}")
        return cls(**{k: str(v) for k, v in d.items() if k in fields})


def source_digest(r: SubmissionResult) -> str:
    """The digest of the source a result was graded from ('' for results from before keys)."""
    return dict(r.key).get("source", "")


def decision_log(out_dir: Path) -> list[Decision]:
    """Every decision recorded in `out_dir`, oldest first; [] when none was. ReviewError for a
    file that is not what `review` writes: rendering without it would rank a disqualified
    submission, so nothing is rendered."""
    path = Path(out_dir) / DECISIONS_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ReviewError(f"{path}: unreadable ({e}); it holds the instructors' review decisions: "
                          f"restore it from a backup, or remove it and decide again "
                          f"(python -m grader review --out {out_dir})") from None
    try:
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ValueError(f"not a decisions file of this grader (schema "
                             f"{data.get('schema') if isinstance(data, dict) else None!r})")
        return [Decision.from_dict(d) for d in data.get("decisions") or []]
    except (ValueError, TypeError) as e:
        raise ReviewError(f"{path}: {e}; restore it from a backup, or remove it and decide again "
                          f"(python -m grader review --out {out_dir})") from None


def load_decisions(out_dir: Path) -> dict[str, Decision]:
    """The decision in force for each submission: the latest one recorded for it."""
    return {d.id: d for d in decision_log(out_dir)}


def record_decision(out_dir: Path, decision: Decision) -> Path:
    """Add `decision` to the results folder's log (the earlier ones kept), written atomically;
    two commands deciding at once both land (a lock around the read and the write)."""
    out_dir = Path(out_dir)
    with open(out_dir / LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        log = decision_log(out_dir)
        path = out_dir / DECISIONS_FILE
        write_json_atomic(path, dict(schema=SCHEMA, decisions=[d.to_dict() for d in [*log, decision]]))
    return path


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def make_decision(r: SubmissionResult, decision: str, note: str, *, by: str = "",
                  when: str | None = None) -> Decision:
    """A decision on `r` as graded now (its source digest and status)."""
    return Decision(id=r.id, decision=decision, note=clean(note.strip(), NOTE_CHARS),
                    when=when or now(), source=source_digest(r), by=clean(by, 100),
                    status=r.status.value)


# ---------------------------------------------------------------- applying them


def holds(d: Decision, r: SubmissionResult) -> bool:
    """Whether `d` was made on the source `r` was graded from."""
    return bool(d.source) and d.source == source_digest(r)


def _stamp(d: Decision) -> str:
    """When, and by whom: '2026-11-27T10:00:00+00:00, by jdoe'."""
    return d.when + (f", by {d.by}" if d.by else "")


def cleared_note(d: Decision) -> str:
    """Who cleared it, when and why: the note the student reads in the feedback."""
    return f"cleared after an instructor's review ({_stamp(d)})" + (f": {d.note}" if d.note else "")


def disqualified_message(d: Decision) -> str:
    return f"disqualified after an instructor's review: {d.note}"


def apply_decision(r: SubmissionResult, d: Decision | None) -> SubmissionResult:
    """`r` as the reports show it under decision `d` (none, or one made on another source:
    `r` unchanged). Applying it twice changes nothing more. A status the grading machine decided
    (not_run, environment_error, no_result) is never overruled: it is not graded yet."""
    if d is None or r.role != "student" or r.no_result or not holds(d, r) or not r.status.scored:
        return r
    if d.decision == DISQUALIFIED:
        message = disqualified_message(d)
        return dataclasses.replace(r, status=Status.FLAGGED, message=message,
                                   notes=_with(r.notes, f"{message} ({_stamp(d)})"))
    note = cleared_note(d)
    if r.status is Status.REVIEW:
        verdict = r.message.splitlines()[0] if r.message else ""
        ran = [c for c in r.cases if c.status is not Status.NOT_RUN]
        message = f"all {len(ran)} cases run pass" + (
            f"; median {r.timing.median_ms:.3f} ms ({r.timing.tflops:.1f} TFLOP/s)" if r.timing else "")
        # The note goes where the student reads it (feedback), not into the verdict, which the
        # students' page shows to the class.
        return dataclasses.replace(r, status=Status.PASS,
                                   message=f"{message}; cleared after an instructor's review",
                                   notes=_with(r.notes, note + (f" (the audit had said: {verdict})"
                                                                if verdict else "")))
    if r.status is Status.PASS:
        return dataclasses.replace(r, notes=_with(r.notes, note))
    return r   # cleared, but this grading of the same source failed: its verdict stands


def _with(notes: tuple[str, ...], note: str) -> tuple[str, ...]:
    return notes if note in notes else (*notes, note)


def apply_decisions(results: list[SubmissionResult],
                    decisions: dict[str, Decision]) -> list[SubmissionResult]:
    """Every result as the reports show it: each decision applied where it holds."""
    return [apply_decision(r, decisions.get(r.id)) for r in results]


# ---------------------------------------------------------------- the queue


@dataclasses.dataclass(frozen=True)
class Source:
    """A queued submission's source as the instructor sees it: the text (capped, control
    characters made visible), and what to know about it (cut, changed since grading, gone)."""
    text: str
    note: str = ""


@dataclasses.dataclass(frozen=True)
class QueueEntry:
    """One submission in the review queue."""
    result: SubmissionResult        # as reported: its decision applied where it holds
    graded: Status                  # the status the grader gave, before any decision
    reasons: tuple[str, ...]        # why it is in the queue
    decision: Decision | None       # the latest decision on it, holding or stale
    stale: bool                     # the decision was made on another source
    rank: int | None                # among the ranked students, decisions applied
    source: Source | None = None

    @property
    def id(self) -> str:
        return self.result.id

    @property
    def pending(self) -> bool:
        """Waits for an instructor: no decision yet, or one made on another source."""
        return self.decision is None or self.stale

    @property
    def state(self) -> str:
        if self.decision is None:
            return "waiting for a decision"
        d = self.decision
        if self.stale:
            return (f"STALE: {d.decision} on {d.when} for another source ({d.source[:12] or 'none'}; "
                    f"graded now from {source_digest(self.result)[:12]}): decide again")
        if d.decision == CLEARED and self.result.status not in (Status.PASS,):
            return f"cleared on {d.when}, but this grading is {self.result.status.value}: its verdict stands"
        return f"{d.decision} on {d.when}" + (f" by {d.by}" if d.by else "") + f": {d.note or '(no note)'}"


def _medians(results: list[SubmissionResult]) -> tuple[dict[str, float], dict[str, str]]:
    times = {r.id: r.timing.median_ms for r in results if r.role == "baseline" and r.timing}
    labels = {r.id: r.label for r in results if r.role == "baseline"}
    return times, labels


def queue_reasons(r: SubmissionResult, graded: Status, rank: int | None, *, top: int,
                  library: dict[str, tuple[str, float]], decision: Decision | None,
                  stale: bool) -> list[str]:
    """Why `r` (decisions applied) is in the queue; [] when it is not. `library`: the library
    baselines' (label, median ms) on its GPU."""
    reasons = []
    if graded is Status.REVIEW:
        reasons.append("review: uses code the grader's audit cannot account for")
    if rank is not None and rank <= top:
        reasons.append(f"rank {rank}: in the top {top}")
    if r.ranked:
        for label, ms in library.values():
            if r.timing.median_ms <= ms:
                reasons.append(f"at or faster than {label} ({r.timing.median_ms:.3f} ms against "
                               f"{ms:.3f} ms in the same run)")
    if decision is not None and stale:
        reasons.append(f"its {decision.decision} decision was made on another source")
    elif decision is not None and not reasons:
        reasons.append(f"{decision.decision} by an instructor")
    return reasons


def review_queue(results: list[SubmissionResult], decisions: dict[str, Decision], *, top: int,
                 by_gpu: dict[int, dict[str, float]] | None = None,
                 folders: dict[str, Path] | None = None,
                 with_source: bool = True) -> list[QueueEntry]:
    """The review queue of `results` (as graded: decisions are applied here): waiting ones
    first, then by status and rank. `by_gpu` (a run on several GPUs): each GPU's baseline
    medians, so a row is compared with the library rows of its own GPU. `folders`: where each
    submission's folder is (folders_of), for its source."""
    times, labels = _medians(results)
    shown = apply_decisions(results, decisions)
    ranked = sorted((r for r in shown if r.ranked and r.role == "student"),
                    key=lambda r: r.timing.median_ms)
    ranks = {r.id: i for i, r in enumerate(ranked, start=1)}
    entries = []
    for graded, r in zip(results, shown):
        if r.role != "student" or r.no_result:
            continue
        own = {**times, **((by_gpu or {}).get(r.gpu.index, {}) if r.gpu is not None else {})}
        library = {b: (labels.get(b, b), own[b]) for b in LIBRARY_BASELINES if own.get(b)}
        d = decisions.get(r.id)
        stale = d is not None and not holds(d, graded)
        reasons = queue_reasons(r, graded.status, ranks.get(r.id), top=top, library=library,
                                decision=d, stale=stale)
        if not reasons:
            continue
        source = (read_source((folders or {}).get(r.id), source_digest(graded))
                  if with_source else None)
        entries.append(QueueEntry(r, graded.status, tuple(reasons), d, stale, ranks.get(r.id), source))
    return sorted(entries, key=lambda e: (not e.pending, e.graded is not Status.REVIEW,
                                          e.rank or 10**9, e.id))


def folders_of(run: dict) -> dict[str, Path]:
    """Each submission's folder, as the run file's roster records it (runs.Entry.roster)."""
    return {e["id"]: Path(e["folder"]) for e in run.get("roster") or ()
            if isinstance(e, dict) and e.get("folder") and e.get("role") == "student"}


def _not_regular(folder: Path, limit: int = 10_000) -> str:
    """The first entry of `folder` that is not a regular file, a folder or a link ('' if none):
    opening a pipe would block the grader, a device would read forever."""
    seen = 0
    for root, dirs, files in os.walk(folder, followlinks=False):
        for name in dirs + files:
            seen += 1
            if seen > limit:
                return ""   # read_sources stops long before
            try:
                mode = os.lstat(os.path.join(root, name)).st_mode
            except OSError:
                continue
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
                return os.path.relpath(os.path.join(root, name), folder)
    return ""


def read_source(folder: Path | None, graded: str, *, limit: int = SOURCE_SHOWN_CHARS) -> Source:
    """The source files of a queued submission's folder (submission.read_sources: source
    suffixes only, capped), each under a '==> path <==' line, at most `limit` characters; the
    note says plainly when the folder is gone, when it changed since it was graded (what is
    shown is then not what was graded), or when the text was cut."""
    if folder is None:
        return Source("", "the run file does not say where its folder is (graded before the "
                          "review queue existed): grade it again to record it")
    if not folder.is_dir():
        return Source("", f"its folder {folder} is gone (moved or deleted since it was graded): "
                          f"there is no source to show")
    odd = _not_regular(folder)
    if odd:
        return Source("", f"its folder {folder} holds {odd}, which is not a regular file: not read")
    notes = []
    if graded and folder_digest(folder) != graded:
        notes.append(f"its folder {folder} has changed since it was graded: what is shown is not "
                     f"what was graded; grade it again before deciding")
    files = split_sources(read_sources(folder))
    text = "\n".join(f"==> {name} <==\n{body.rstrip()}\n" for name, body in files.items() if name)
    text = clean(text.replace(FILE_MARK, ""), limit=10**9)
    if not text:
        notes.append(f"its folder {folder} holds no source file")
    if len(text) > limit:
        notes.append(f"shown: the first {limit:,} of {len(text):,} characters; the rest is in {folder}")
        text = text[:limit]
    return Source(text, "; ".join(notes))


# ---------------------------------------------------------------- deciding


def close_ids(wanted: str, ids: list[str], n: int = 5) -> list[str]:
    """The ids nearest to `wanted`, for an error that names them."""
    return difflib.get_close_matches(wanted, ids, n=n, cutoff=0.5)


def decision_problem(wanted: str, decision: str, note: str, results: list[SubmissionResult],
                     queue: list[QueueEntry]) -> str:
    """'' when `decision` may be recorded on submission `wanted`; else the error to print: an
    id not in the run (with the close ones), a disqualification without a note, a result with no
    source digest, or a submission neither in the queue nor ranked."""
    students = {r.id: r for r in results if r.role == "student"}
    r = students.get(wanted)
    if r is None:
        near = close_ids(wanted, list(students))
        listed = ", ".join(sorted(students)[:10]) + (" ..." if len(students) > 10 else "")
        return (f"no submission named {wanted!r} in this run; " +
                (f"did you mean {', '.join(near)}?" if near else f"its submissions: {listed or 'none'}"))
    if decision == DISQUALIFIED and not note.strip():
        return (f"{wanted}: a disqualification needs --note: the student reads it as the verdict, "
                f"so say what the code does that the assignment does not allow")
    if r.no_result:
        return f"{wanted}: no result to decide on ({r.no_result})"
    if not source_digest(r):
        return (f"{wanted}: its result does not record its source digest (graded before results had "
                f"keys): grade it again (python -m grader grade --only {wanted}), then decide")
    in_queue = any(e.id == wanted for e in queue)
    shown = next((e.result for e in queue if e.id == wanted), r)
    if not (in_queue or r.ranked or shown.ranked):
        return (f"{wanted} is {r.status.value}: not in the review queue and not ranked, so there is "
                f"nothing to decide (a decision clears or disqualifies a review result or a ranked one)")
    return ""


# ---------------------------------------------------------------- the terminal


def queue_text(entries: list[QueueEntry], *, out_dir: Path, top: int, width: int = 100,
               full: bool = False, unknown: list[str] = ()) -> str:
    """The queue for a terminal: each entry's state, reasons, the audit's findings and notes,
    kernels and time; `full`: its source too. `unknown`: decisions naming no submission of
    this run."""
    waiting = sum(e.pending for e in entries)
    lines = [f"{clean(entries[0].id)}, in the review queue of {out_dir}:" if full and len(entries) == 1 else
             f"review queue of {out_dir}: {len(entries)} submission{'s' if len(entries) != 1 else ''}, "
             f"{waiting} waiting for a decision (in it: every review result, the top {top} ranked, "
             f"and every ranked one at or faster than SDPA FLASH or cuDNN)"]
    wrap = lambda text, indent: textwrap.wrap(clean(text), width, initial_indent=indent,
                                              subsequent_indent=indent + "  ",
                                              break_long_words=False, break_on_hyphens=False) or [indent]
    for i, e in enumerate(entries, start=1):
        r = e.result
        head = f"{i:3}. {clean(e.id)}  {r.status.value}" + (f"  rank {e.rank}" if e.rank else "") + (
            f"  {r.timing.median_ms:.3f} ms" if r.timing else "") + (
            f"  (graded {e.graded.value})" if e.graded is not r.status else "")
        lines += ["", head]
        lines += wrap(e.state, "     decision: ")
        for reason in e.reasons:
            lines += wrap(reason, "     why: ")
        for finding in r.review:
            lines += wrap(finding, "     audit: ")
        for note in r.audit_notes:
            lines += wrap(note, "     audit note: ")
        for k in r.kernels[:8]:
            lines += wrap(f"{100 * k.share:5.1f}%  {k.name} x {k.count}, {k.gpu_ms:.3f} ms, "
                          f"defined at {k.defined_at or 'unknown'}", "     kernel: ")
        if len(r.kernels) > 8:
            lines.append(f"     kernel: ... {len(r.kernels) - 8} more")
        if full and e.source is not None:
            if e.source.note:
                lines += wrap(e.source.note, "     source: ")
            lines += ["     " + line for line in e.source.text.splitlines()]
    if unknown:
        lines += ["", f"decisions naming no submission of this run (kept): {', '.join(map(clean, unknown))}"]
    lines += ["", f"see one in full (its source too): python -m grader review --out {out_dir} ID",
              f"decide: python -m grader review --out {out_dir} ID --clear|--disqualify --note TEXT",
              "        (make review ID=... DECISION=cleared|disqualified NOTE=\"...\")"]
    return "\n".join(lines)

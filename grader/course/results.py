"""Result files: one JSON per submission, written atomically the moment it is known, and read
back as one run's roster: every submission the run file lists, and only those."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from pathlib import Path

from grader.common.status import Status
from grader.course.verdicts import BuildResult, CaseResult, TimingStats

SCHEMA_VERSION = 1
RUN_FILE = "_run.json"      # the run's device, cases, limits, roster and progress (report.RUN_FILE)
# A roster entry with no usable result is shown with this status (the grading side's failure,
# never scored) and a message that says why; `SubmissionResult.no_result` marks the placeholder.
NO_RESULT_STATUS = Status.NO_RESULT


class ResultUnreadable(ValueError):
    """A result file that cannot be used: missing, truncated, not JSON, or of a newer schema."""


class ResultTooNew(ResultUnreadable):
    """A result file of a newer schema than this grader reads: update the grader, or regrade."""


class RunFileError(ValueError):
    """The run file is missing, truncated or not what a grader wrote."""


@dataclasses.dataclass(frozen=True)
class GpuRef:
    """The GPU a result was graded on: its CUDA index in the grading run, name and UUID."""
    index: int | None
    name: str
    uuid: str = ""

    @property
    def label(self) -> str:
        return f"GPU {self.index}" if self.index is not None else self.name

    def to_dict(self) -> dict:
        return dict(index=self.index, name=self.name, uuid=self.uuid)

    @classmethod
    def from_dict(cls, d) -> "GpuRef | None":
        if not isinstance(d, dict):
            return None
        index = d.get("index")
        return cls(index=index if isinstance(index, int) else None, name=str(d.get("name", "")),
                   uuid=str(d.get("uuid", "")))


# Where a run stage's time goes, in order (grader/trusted/harness.py measures them): the harness's taking
# up its spec (its process start and imports, unless it was started warm: harnesses.WarmHarness);
# CUDA's start in it and the shared buffers; the subject's start in the sandbox, its imports,
# CUDA's start there and the submission's import; every case's call. A run begun before its turn
# (lookahead.Lookahead) has "prepare" instead of "subject" (the subject's start, its imports,
# CUDA's and the profiler's first start: no submission code), "waiting" until its turn and
# "load" (the submission's import). Only "load" and "cases" of such a run are in its run stage:
# the rest overlapped the submission before it.
RUN_PHASES = ("harness", "buffers", "subject", "prepare", "waiting", "load", "cases")
# Where a time stage's seconds go, as its harness measured them (time_stage.time_case),
# "time.<part>" in stage_s: "open" (the case's buffers and the L2 flush buffer; when the subject
# is not the run stage's, its start and a run stage's calls made again: run_stage.run_stage_calls), "rtt" (round trips with no GPU work), "warmup" (the warm-up
# calls, the profiler turned on), "loop" (the timed calls, each one's output checked), "report"
# (the profiler turned off, the kernels it saw, the subject's exit), "spots" (the kept calls
# against the fp32 reference). What the stage holds beyond them is the pipes and the pipeline's
# own work.
TIME_PHASES = ("open", "rtt", "warmup", "loop", "report", "spots")
# Where the timed loop's time goes, per part summed over its calls ("time.loop.<part>" in
# stage_s): before "go" (fresh inputs, their copy, O poisoned, L2 flushed, the pipe drained, the
# device idle), the call (go to reply), O read back, the check of its output (verify_call), the
# GPU's process list (every TIMING_PROCESS_CHECK_EVERY calls) and the rest (statistics, samples).
LOOP_PARTS = ("prep", "call", "readback", "verify", "helpers", "rest")

@dataclasses.dataclass(frozen=True)
class KernelShare:
    """One kernel (or, without a GPU, operator) of the timed calls, for the review queue: how
    often it ran, its GPU time, its share of the kernels' time, and where it is defined ('file
    line N' of the submission's own source, 'library' for a library's, '' when unknown)."""
    name: str
    count: int
    gpu_ms: float
    share: float
    defined_at: str = ""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "KernelShare":
        return cls(name=str(d["name"]), count=int(d.get("count", 0)),
                   gpu_ms=float(d.get("gpu_ms", 0.0)), share=float(d.get("share", 0.0)),
                   defined_at=str(d.get("defined_at", "")))


@dataclasses.dataclass(frozen=True)
class SubmissionResult:
    id: str
    label: str                  # display name: the student's id, or a baseline's name
    kind: str                   # 'cuda', 'python', 'invalid' or 'builtin' (PyTorch baselines)
    role: str                   # 'student' or 'baseline'
    status: Status
    message: str                # the verdict in one or two lines
    hint: str = ""              # where to look next (student-facing)
    build: BuildResult | None = None
    cases: tuple[CaseResult, ...] = ()
    timed_case: str | None = None
    timing: TimingStats | None = None
    notes: tuple[str, ...] = ()  # what was and was not run, and why
    wall_s: float = 0.0          # grading wall time of this submission, build included
    graded_at: str = ""
    # What determined this result (grader/course/runs.py: source, cases, grader, policy, device,
    # limits, sandbox), as (part, digest) pairs: a rerun with the same key skips it.
    key: tuple[tuple[str, str], ...] = ()
    no_result: str = ""          # a placeholder for a roster entry with no usable result: why
    # Seconds in each stage it went through, in order: build, run, check, time (throughput);
    # then the run and time stages' parts as their harness measured them, "run.<part>"
    # (RUN_PHASES) and "time.<part>" (TIME_PHASES).
    stage_s: tuple[tuple[str, float], ...] = ()
    # The GPU its run, check and timing ran on (a run on several GPUs: one worker each); None
    # without a GPU, and in results written before GPU workers.
    gpu: GpuRef | None = None
    # Why an instructor must look before it ranks (Status.REVIEW, grader/course/review.py): what the
    # audit could not account for, each 'file line N: name (why)'. Kept whatever the status.
    review: tuple[str, ...] = ()
    # Unusual constructs the audit allows but an instructor reviewing it should see (C++:
    # integers cast to pointers, inline assembly, magic numbers; each 'where: what').
    audit_notes: tuple[str, ...] = ()
    # The timed calls' kernels with their share of the time and where each is defined.
    kernels: tuple[KernelShare, ...] = ()
    # Read from a file another grader version wrote (read_result): what could not be read, and
    # how to refresh it; never written (a report's note, like `no_result`). `partial`: its cases
    # or timing could not be read, so its status is shown but it is never scored (a regrade is).
    version_note: str = ""
    partial: bool = False

    @property
    def launched(self) -> tuple[str, tuple[tuple[str, int], ...]] | None:
        """(case, [(kernel or operator, count)]) of the largest case whose call was profiled."""
        profiled = [c for c in self.cases if c.launched]
        return (profiled[-1].case, profiled[-1].launched) if profiled else None

    @property
    def ranked(self) -> bool:
        return self.status is Status.PASS and self.timing is not None

    def to_dict(self) -> dict:
        return dict(schema=SCHEMA_VERSION, id=self.id, label=self.label, kind=self.kind,
                    role=self.role, status=self.status.value, message=self.message,
                    hint=self.hint, build=self.build.to_dict() if self.build else None,
                    cases=[c.to_dict() for c in self.cases], timed_case=self.timed_case,
                    timing=self.timing.to_dict() if self.timing else None,
                    notes=list(self.notes), wall_s=self.wall_s, graded_at=self.graded_at,
                    key=dict(self.key), stage_s=dict(self.stage_s),
                    **(dict(gpu=self.gpu.to_dict()) if self.gpu else {}),
                    review=list(self.review), audit_notes=list(self.audit_notes),
                    kernels=[k.to_dict() for k in self.kernels])

    @classmethod
    def from_dict(cls, d: dict) -> "SubmissionResult":
        """Fields a newer grader added (here or in a nested record) are ignored; a missing
        required one raises KeyError, a status this grader does not know ValueError."""
        build = d.get("build")
        if build:   # BuildResult takes exactly its fields
            build = BuildResult.from_dict({k: v for k, v in build.items() if k in _BUILD_FIELDS})
        return cls(id=d["id"], label=d["label"], kind=d["kind"], role=d["role"],
                   status=Status(d["status"]), message=d["message"], hint=d.get("hint", ""),
                   build=build or None,
                   cases=tuple(CaseResult.from_dict(c) for c in d.get("cases", ())),
                   timed_case=d.get("timed_case"),
                   timing=TimingStats.from_dict(d["timing"]) if d.get("timing") else None,
                   notes=tuple(d.get("notes", ())), wall_s=d.get("wall_s", 0.0),
                   graded_at=d.get("graded_at", ""),
                   key=tuple(sorted((str(k), str(v)) for k, v in (d.get("key") or {}).items())),
                   stage_s=tuple((str(k), float(v)) for k, v in (d.get("stage_s") or {}).items()),
                   gpu=GpuRef.from_dict(d.get("gpu")),
                   review=tuple(str(x) for x in d.get("review") or ()),
                   audit_notes=tuple(str(x) for x in d.get("audit_notes") or ()),
                   kernels=tuple(KernelShare.from_dict(k) for k in d.get("kernels") or ()))


_BUILD_FIELDS = {f.name for f in dataclasses.fields(BuildResult)}


def write_json_atomic(path: Path, data) -> None:
    """Write to a temporary file beside `path`, fsync, then rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, allow_nan=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def path_for(out_dir: Path, id: str, role: str, gpu: str = "") -> Path:
    """Where the result of submission `id` lives (baselines, the solution among them, apart).
    `gpu` (a run on several GPUs): a baseline's copy timed on another GPU than the run's first,
    under baselines/<gpu>/ ('gpu1'), where nothing that reads baselines/*.json finds it."""
    if role == "baseline":
        return out_dir / "baselines" / gpu / f"{id}.json" if gpu else out_dir / "baselines" / f"{id}.json"
    return out_dir / f"{id}.json"


def result_path(out_dir: Path, result: SubmissionResult) -> Path:
    return path_for(out_dir, result.id, result.role)


def write_result(out_dir: Path, result: SubmissionResult, *, path: Path | None = None) -> Path:
    """Write `result` where it lives (`path`: a per-GPU baseline copy's, from path_for)."""
    if result.no_result:
        raise ValueError(f"{result.id}: a placeholder ({result.no_result}) is never written")
    path = path or result_path(out_dir, result)
    write_json_atomic(path, result.to_dict())
    return path


def _result_data(path: Path) -> dict:
    """The JSON object of a result file; ResultUnreadable when it is missing, damaged (empty,
    truncated, not JSON, not an object), ResultTooNew when a newer grader wrote it."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ResultUnreadable("no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ResultUnreadable(f"cannot be read ({e})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        what = "empty" if not text.strip() else "truncated or not JSON"
        raise ResultUnreadable(f"{what} ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(data, dict):
        raise ResultUnreadable(f"not a result (a JSON {type(data).__name__})")
    schema = data.get("schema")
    if isinstance(schema, int) and schema > SCHEMA_VERSION:
        raise ResultTooNew(f"written by a newer grader (schema {schema}; this grader reads "
                           f"schema {SCHEMA_VERSION}): update the grader, or regrade")
    return data


def load_result(path: Path) -> SubmissionResult:
    """One result file of this grader, or ResultUnreadable saying what is wrong with it."""
    data = _result_data(path)
    schema = data.get("schema")
    if schema != SCHEMA_VERSION:
        raise ResultUnreadable(f"not a result of this grader (schema {schema!r})")
    try:
        return SubmissionResult.from_dict(data)
    except KeyError as e:
        raise ResultUnreadable(f"field {e.args[0]!r} is missing") from None
    except (ValueError, TypeError, AttributeError) as e:
        raise ResultUnreadable(f"a field has a value this grader does not know ({e})") from None


_UNREADABLE_FIELD = (KeyError, ValueError, TypeError, AttributeError)
_REQUIRED = ("label", "kind", "role", "message")
_SCORED_BY = ("cases", "timing")   # every grader writes both (timing: null when not timed)


def read_result(path: Path, entry: dict) -> SubmissionResult:
    """The result of `entry` (a run roster's line: id, role, kind, label) as the reports show
    it: this grader's, or what can be read of one another grader version wrote (an older
    schema, a field missing, a value this grader does not know), with a note on it. Only a
    missing, damaged or newer file raises ResultUnreadable: another version's is never dropped."""
    data = _result_data(path)
    if data.get("schema") == SCHEMA_VERSION:
        try:
            return SubmissionResult.from_dict(data)
        except _UNREADABLE_FIELD:
            pass
    if not ({"status", "id"} & set(data)):
        raise ResultUnreadable("not a result (no id and no status)")
    return _salvage(data, entry)


def _salvage(data: dict, entry: dict) -> SubmissionResult:
    """What can be read of another grader version's result: each field this grader cannot
    read is left out and named in the note; a status it does not know reads as no_result (not
    graded until regraded), and its cases, if readable, are kept. With its cases or timing
    missing or unreadable it is `partial`: shown with its status, never scored."""
    id, schema = entry["id"], data.get("schema")
    problems = [] if schema == SCHEMA_VERSION else [
        f"schema {schema}" if schema is not None else "no schema number"]
    fallback = dict(label=entry.get("label") or id, kind=entry.get("kind", "invalid"),
                    role=entry.get("role", "student"), message="")
    base = dict(id=id, status=data.get("status"))
    for field in _REQUIRED:
        value = data.get(field)
        if not isinstance(value, str) or (field == "role" and value not in ("student", "baseline")):
            problems.append(f"field {field!r} {'missing' if value is None else 'unreadable'}")
            value = fallback[field]
        base[field] = value
    known = {s.value for s in Status}
    if base["status"] not in known:
        problems.append("field 'status' missing" if base["status"] is None else
                        f"status {base['status']!r} unknown to this grader")
        base["status"] = NO_RESULT_STATUS.value
    kept = {}
    for field, value in data.items():
        if field in base or field in ("id", "schema"):
            continue
        try:
            if field == "wall_s" and not isinstance(value, (int, float)):
                raise TypeError(field)
            SubmissionResult.from_dict({**base, field: value})
            kept[field] = value
        except _UNREADABLE_FIELD:
            problems.append(f"field {field!r} unreadable")
    problems += [f"field {field!r} missing" for field in _SCORED_BY if field not in data]
    older = isinstance(schema, int) and schema < SCHEMA_VERSION or schema is None
    note = (f"written by {'an older grader' if older else 'another grader version'} "
            f"({'; '.join(problems)}): regrade with --only {id} to refresh")
    result = SubmissionResult.from_dict({**base, **kept})
    return dataclasses.replace(
        result, message=f"[{note}] {result.message}".rstrip(), version_note=note,
        no_result=note if result.status is NO_RESULT_STATUS else "",
        partial=any(field not in kept for field in _SCORED_BY))


def read_run(out_dir: Path, *, complete: bool = True) -> dict:
    """The run file of `out_dir`, or RunFileError naming the file and what to do. `complete`:
    it must also hold what the pages need (the device and the cases)."""
    path = out_dir / RUN_FILE
    try:
        run = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunFileError(f"{path}: no such file; run 'python -m grader grade' first") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RunFileError(f"{path}: truncated or not JSON ({e}); the run that wrote it did not "
                           f"finish writing it: grade again ('python -m grader grade'; unchanged "
                           f"submissions are skipped)") from None
    if not isinstance(run, dict):
        raise RunFileError(f"{path}: not a grading run's file (a JSON {type(run).__name__}); grade again")
    if complete and not (isinstance(run.get("device"), dict) and isinstance(run.get("cases"), list)):
        raise RunFileError(f"{path}: not a grading run's file (no device or cases); grade again")
    return run


def placeholder(entry: dict, path: Path, reason: str) -> SubmissionResult:
    """The row of a roster entry that has no usable result: never silently absent."""
    why = f"result {'missing' if 'no such file' in reason else 'unreadable'}: {path}: {reason}"
    return SubmissionResult(id=entry["id"], label=entry.get("label") or entry["id"],
                            kind=entry.get("kind", "invalid"), role=entry.get("role", "student"),
                            status=NO_RESULT_STATUS, message=why, no_result=why,
                            notes=("no result for this run: it is not graded",))


def _missing_reason(run: dict) -> str:
    state = run.get("state")
    if state == "running":
        return "no such file: not graded yet (the run is in progress, or was killed: grade again)"
    if state == "interrupted":
        return "no such file: not graded (the run was interrupted; grade again to finish)"
    return "no such file (deleted?): regrade it with 'python -m grader grade --only ID'"


def read_results(out_dir: Path, run: dict | None = None) -> list[SubmissionResult]:
    """The results of the run in `out_dir`: one per entry of its roster, in roster order, as
    read_result reads them (another grader version's with a note), a placeholder (`no_result`,
    NO_RESULT_STATUS) for an entry whose file is missing, damaged, of a newer schema, or graded
    with another key than the run's; results of other runs in the folder are left out. A run
    file from before rosters (no 'roster') reads every result file in the folder, a damaged one
    as a placeholder. RunFileError for a truncated run file."""
    if run is None:
        run = read_run(out_dir, complete=False) if (out_dir / RUN_FILE).exists() else {}
    if not isinstance(run.get("roster"), list):
        return _every_result(out_dir)
    results = []
    for entry in run["roster"]:
        if entry.get("gpu"):   # a baseline's copy on another GPU: read_gpu_copies
            continue
        path = out_dir / entry["result"]
        try:
            result = read_result(path, entry)
        except ResultUnreadable as e:
            reason = _missing_reason(run) if str(e) == "no such file" else _unreadable_reason(e, entry)
            results.append(placeholder(entry, path, reason))
            continue
        want = entry.get("key")
        if want and key_digest(result.key) != want:
            results.append(placeholder(entry, path, "graded from other inputs than this run's "
                                       "(not regraded: the run was interrupted or stopped); grade again"))
            continue
        results.append(result)
    return results


def _unreadable_reason(e: ResultUnreadable, entry: dict) -> str:
    """Why a result file cannot be read, and the fix: a damaged one is graded again."""
    if isinstance(e, ResultTooNew):
        return str(e)
    return f"{e}; regrade it with --only {entry['id']} to replace it"


def read_gpu_copies(out_dir: Path, run: dict | None = None) -> list[SubmissionResult]:
    """The baselines a run on several GPUs timed on each GPU but its first (roster entries with
    a 'gpu'), each result carrying its GPU; an entry with no usable result of the run's key is
    left out (the page shows that GPU's median as missing)."""
    if run is None:
        run = read_run(out_dir, complete=False) if (out_dir / RUN_FILE).exists() else {}
    copies = []
    for entry in run.get("roster") or []:
        if not (isinstance(entry, dict) and entry.get("gpu")):
            continue
        try:
            result = load_result(out_dir / entry["result"])
        except (ResultUnreadable, KeyError):
            continue
        if not entry.get("key") or key_digest(result.key) == entry["key"]:
            copies.append(result)
    return copies


def _every_result(out_dir: Path) -> list[SubmissionResult]:
    """Every result file in the folder (a run file from before rosters), none left out."""
    results = []
    for path in sorted(out_dir.glob("*.json")) + sorted((out_dir / "baselines").glob("*.json")):
        if path.name.startswith("_"):
            continue
        entry = dict(id=path.stem, label=path.stem, kind="invalid",
                     role="baseline" if path.parent.name == "baselines" else "student")
        try:
            results.append(read_result(path, entry))
        except ResultUnreadable as e:
            results.append(placeholder(entry, path, _unreadable_reason(e, entry)))
    return results


def key_digest(key) -> str:
    """One digest of a result's key ((part, digest) pairs, or a dict of them)."""
    pairs = sorted(dict(key).items())
    return hashlib.sha256(json.dumps(pairs).encode()).hexdigest()[:16] if pairs else ""

"""Result files: one JSON per submission, written atomically the moment it is known."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path

from .build import BuildResult
from .correctness import CaseResult
from .status import Status
from .timing import TimingStats

SCHEMA_VERSION = 1


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
                    notes=list(self.notes), wall_s=self.wall_s, graded_at=self.graded_at)

    @classmethod
    def from_dict(cls, d: dict) -> "SubmissionResult":
        return cls(id=d["id"], label=d["label"], kind=d["kind"], role=d["role"],
                   status=Status(d["status"]), message=d["message"], hint=d.get("hint", ""),
                   build=BuildResult.from_dict(d["build"]) if d.get("build") else None,
                   cases=tuple(CaseResult.from_dict(c) for c in d.get("cases", ())),
                   timed_case=d.get("timed_case"),
                   timing=TimingStats.from_dict(d["timing"]) if d.get("timing") else None,
                   notes=tuple(d.get("notes", ())), wall_s=d.get("wall_s", 0.0),
                   graded_at=d.get("graded_at", ""))


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


def result_path(out_dir: Path, result: SubmissionResult) -> Path:
    if result.role == "baseline":
        return out_dir / "baselines" / f"{result.id}.json"
    return out_dir / f"{result.id}.json"


def write_result(out_dir: Path, result: SubmissionResult) -> Path:
    path = result_path(out_dir, result)
    write_json_atomic(path, result.to_dict())
    return path


def read_results(out_dir: Path) -> list[SubmissionResult]:
    """Every result file in `out_dir` (students) and `out_dir/baselines`; unreadable ones skipped."""
    results = []
    for path in sorted(out_dir.glob("*.json")) + sorted((out_dir / "baselines").glob("*.json")):
        if path.name.startswith("_"):
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(data, dict) and data.get("schema") == SCHEMA_VERSION:
            results.append(SubmissionResult.from_dict(data))
    return results

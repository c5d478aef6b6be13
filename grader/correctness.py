"""Check stage: run the pytest correctness tests in a child process, read pytest-json-report."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from . import config
from .cases import Case
from .compare import Finding
from .procs import ProcResult, run_limited, split_cpus
from .status import Status

CHECK_TESTS = Path(__file__).parent / "checks" / "test_outputs.py"


@dataclasses.dataclass(frozen=True)
class CaseResult:
    case: str
    status: Status
    message: str = ""
    hidden: bool = False
    finding: Finding | None = None
    run_s: float | None = None              # the submission's first call on this case
    peak_memory_bytes: int | None = None    # of the check (reference + comparison)
    launched: tuple[tuple[str, int], ...] = ()   # GPU kernels (or CPU operators) of one call: name, count

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["status"] = self.status.value
        d["finding"] = self.finding.to_dict() if self.finding else None
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "CaseResult":
        known = {f.name for f in dataclasses.fields(cls)}
        d = {k: v for k, v in d.items() if k in known}
        return cls(**{**d, "status": Status(d["status"]),
                      "finding": Finding.from_dict(d["finding"]) if d.get("finding") else None,
                      "launched": tuple(tuple(x) for x in d.get("launched", ()))})


def launched_of(run: dict) -> tuple[tuple[str, int], ...]:
    """The (name, count) list of what one call launched, as the subject reported it."""
    return tuple((item[0], item[1]) for item in run.get("launched", ()))


def _run_checker(spec: dict, *, out_dir: Path, limits: config.Limits, env: dict) -> tuple[dict, ProcResult]:
    """Run the pytest checks on `spec` in a child process; its pytest-json-report and the process."""
    spec_path, report_path = out_dir / "check_spec.json", out_dir / "check_report.json"
    spec_path.write_text(json.dumps(spec))
    report_path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", str(CHECK_TESTS), "-q", "-p", "no:cacheprovider",
           "--rootdir", str(CHECK_TESTS.parent), "-o", "addopts=", "--json-report",
           f"--json-report-file={report_path}", "--json-report-omit", "collectors", "log",
           "keywords", "streams", "--json-report-indent=0"]
    proc = run_limited(cmd, timeout_s=limits.check_s, env={**env, "GRADER_CHECK_SPEC": str(spec_path)},
                       cwd=config.REPO_ROOT, cpus=split_cpus(limits.gpu_stage_cpus).gpu)
    report = json.loads(report_path.read_text()) if report_path.exists() else {"tests": []}
    return report, proc


def _checker_broke(proc: ProcResult, where: str) -> str:
    """The checker itself failed: the grader's problem, said loudly."""
    why = "timed out" if proc.timed_out else f"exited with {proc.returncode}"
    return f"grader error: the checker {why}{where}:\n{proc.tail(20)}"


def check_outputs(cases: list[Case], runs: dict[str, dict], *, out_dir: Path, device: str,
                  limits: config.Limits, env: dict,
                  precision: tuple[float, float] = (config.PRECISION_FACTOR, config.PRECISION_FLOOR)
                  ) -> list[CaseResult]:
    """One CaseResult per case, from the checker's pytest-json-report file."""
    report, proc = _run_checker(dict(cases=[c.to_dict() for c in cases], runs=runs,
                                     out_dir=str(out_dir), device=device,
                                     precision=dict(precision_factor=precision[0],
                                                    precision_floor=precision[1])),
                                out_dir=out_dir, limits=limits, env=env)
    by_case = {t.get("metadata", {}).get("case"): t for t in report["tests"]}
    results = []
    for case in cases:
        run = runs[case.id]
        test = by_case.get(case.id)
        if test is None:   # the checker itself broke: the grader's problem, said loudly
            results.append(CaseResult(case.id, Status.RUNTIME_ERROR, hidden=case.hidden,
                                      run_s=run.get("elapsed_s"),
                                      message=_checker_broke(proc, " before this case")))
            continue
        meta = test.get("metadata", {})
        finding = Finding.from_dict(meta["finding"]) if meta.get("finding") else None
        status = Status(meta.get("status", "pass" if test["outcome"] == "passed" else "runtime_error"))
        message = run["message"] if run["status"] != "pass" else (finding.summary() if finding else "")
        results.append(CaseResult(case.id, status, message, case.hidden, finding,
                                  run.get("elapsed_s"), meta.get("peak_memory_bytes"),
                                  launched_of(run)))
    return results

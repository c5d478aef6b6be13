"""Check stage: run the pytest correctness tests in a child process, read pytest-json-report."""

from __future__ import annotations

import json
import os
import select
import sys
import threading
import time
from pathlib import Path

from grader.common import config
from grader.common.status import Status
from grader.course.verdicts import CaseResult, Finding
from grader.isolation.cpus import split_cpus
from grader.isolation.procs import ProcResult, kill_group, spawn_capped
from grader.problem import Case

CHECK_TESTS = Path(__file__).parent / "checks" / "test_outputs.py"


def launched_of(run: dict) -> tuple[tuple[str, int], ...]:
    """The (name, count) list of what one call launched, as the subject reported it."""
    return tuple((item[0], item[1]) for item in run.get("launched", ()))


def _run_checker(spec: dict, *, out_dir: Path, limits: config.Limits, env: dict) -> tuple[dict, ProcResult]:
    """Run the pytest checks on `spec` in the warm checker (WarmChecker); its pytest-json-report
    and how the checker fared."""
    spec_path, report_path = out_dir / "check_spec.json", out_dir / "check_report.json"
    spec_path.write_text(json.dumps(spec))
    report_path.unlink(missing_ok=True)
    args = [str(CHECK_TESTS), "-q", "-p", "no:cacheprovider", "--rootdir", str(CHECK_TESTS.parent),
            "-o", "addopts=", "--json-report", f"--json-report-file={report_path}",
            "--json-report-omit", "collectors", "log", "keywords", "streams", "--json-report-indent=0"]
    checker = WarmChecker.for_stage(env, split_cpus(limits.gpu_stage_cpus).gpu)
    proc = checker.run(args, spec_path, timeout_s=limits.check_s)
    report = json.loads(report_path.read_text()) if report_path.exists() else {"tests": []}
    return report, proc


class WarmChecker:
    """The checker process of one GPU stage, kept from one submission to the next
    (grader/trusted/checks/server.py): torch is imported, the device initialised and each case's fp32
    reference computed once per run. It is trusted (it never imports submission code) and runs
    one check at a time. It dies with the run (cancel_all, or the thread that started it ending);
    a checker that crashed or ran past the check limit is killed, and the next check starts a
    fresh one."""

    _kept: dict[tuple, "WarmChecker"] = {}
    _kept_lock = threading.Lock()

    def __init__(self, env: dict, cpus: tuple[int, ...]):
        self.env, self.cpus = env, cpus
        self.lock = threading.Lock()
        self.proc = self.reader = None
        self.requests = self.replies = None
        self.pending = b""

    @classmethod
    def for_stage(cls, env: dict, cpus) -> "WarmChecker":
        """The checker for processes with this environment on these CPUs (one per GPU stage)."""
        key = (tuple(sorted(env.items())), tuple(cpus))
        with cls._kept_lock:
            for other in [k for k, c in cls._kept.items() if k != key and not c.alive]:
                del cls._kept[other]   # of an earlier run, or a worker that has ended
            return cls._kept.setdefault(key, cls(env, tuple(cpus)))

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _start(self) -> None:
        self._stop()
        request_r, request_w = os.pipe()
        reply_r, reply_w = os.pipe()
        try:
            self.proc, self.reader = spawn_capped(
                [sys.executable, "-m", "grader.trusted.checks.server", str(request_r), str(reply_w)],
                env=self.env, cwd=config.REPO_ROOT, pass_fds=(request_r, reply_w), cpus=self.cpus,
                head_bytes=4096, tail_bytes=16384)
        except BaseException:
            for fd in (request_w, reply_r):
                os.close(fd)
            raise
        finally:
            os.close(request_r)
            os.close(reply_w)
        self.requests, self.replies = os.fdopen(request_w, "w"), reply_r

    def _stop(self) -> None:
        if self.proc is not None:
            kill_group(self.proc)
            self.reader.join(timeout=10)
        if self.requests is not None:
            try:
                self.requests.close()
            except OSError:   # the unread request of a checker that died
                pass
        if self.replies is not None:
            os.close(self.replies)
        self.requests = self.replies = None
        self.pending = b""

    def run(self, args: list[str], spec_path: Path, *, timeout_s: float) -> ProcResult:
        """One pytest session on `spec_path`; the result reads as a one-off process's would:
        its return code, or timed_out, and the checker's recent output."""
        with self.lock:
            start = time.monotonic()
            for attempt in range(2):   # a checker found dead (killed while idle) is replaced once
                if not self.alive:
                    self._start()
                try:
                    self.requests.write(json.dumps(dict(args=args, spec=str(spec_path))) + "\n")
                    self.requests.flush()
                    reply, timed_out = self._reply(start + timeout_s)
                except OSError:   # it died before it read the request
                    reply, timed_out = None, False
                if reply is None:   # dead or hung: the next check gets a fresh one
                    self._stop()
                if reply is not None or timed_out:
                    break
            code = reply.get("returncode") if reply else None if timed_out else self.proc.returncode
            return ProcResult(returncode=code, timed_out=timed_out,
                              elapsed_s=time.monotonic() - start, output=self.reader.text(),
                              output_bytes=self.reader.total)

    def _reply(self, deadline: float) -> tuple[dict | None, bool]:
        """(the next reply line, False); (None, False) when the checker died (its end of the
        pipe closed, or a line that is no reply), (None, True) when the deadline passed."""
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                return None, True
            if not select.select([self.replies], [], [], left)[0]:
                continue
            chunk = os.read(self.replies, 4096)
            if not chunk:
                return None, False
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        try:
            reply = json.loads(line)
        except ValueError:
            return None, False
        return (reply, False) if isinstance(reply, dict) else (None, False)


# How a case's message begins when the checker itself failed (not the submission's outputs).
CHECKER_BROKE = "grader error: the checker "


def _checker_broke(proc: ProcResult, where: str) -> str:
    """The checker itself failed: the grader's problem, said loudly."""
    why = "timed out" if proc.timed_out else f"exited with {proc.returncode}"
    return f"{CHECKER_BROKE}{why}{where}:\n{proc.tail(20)}"


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
        if meta.get("broke"):   # the checker could not read what the harness wrote: not the case's
            status, message = Status.RUNTIME_ERROR, f"{CHECKER_BROKE}{meta['broke']}"
        results.append(CaseResult(case.id, status, message, case.hidden, finding,
                                  run.get("elapsed_s"), meta.get("peak_memory_bytes"),
                                  launched_of(run), overloaded=bool(run.get("overloaded"))))
    return results

"""Grade submissions: build (in parallel on the CPU cores) -> run -> check -> time (one at a time
on the GPU) -> one result file each, written the moment it is known."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from . import config
from .baselines import BASELINES
from .build import BuildResult, build_submission
from .cases import Case, largest
from .correctness import CaseResult, check_outputs, check_spots, launched_of
from .device import DeviceInfo
from .hints import hint_for
from .integrity import classify_launched, clocks_disagree, own_kernel_names, static_evidence
from .procs import ProcResult, child_env, run_limited
from .progress import Progress
from .results import SubmissionResult, write_result
from .sandbox import Sandbox
from .status import Status, worst
from .submission import Kind, Role, Submission
from .timing import TimingStats


class GpuUnhealthy(RuntimeError):
    """The GPU failed its health check after a submission: grading cannot go on reliably."""


@dataclasses.dataclass(frozen=True)
class GradeContext:
    cases: tuple[Case, ...]
    device: DeviceInfo
    limits: config.Limits
    out_dir: Path
    build_dir: Path
    progress: Progress
    sandbox: Sandbox = Sandbox(None, "not set up")
    calibration: bool = False    # library calls allowed (timing calibration); never ranked

    @property
    def device_name(self) -> str:
        return "cuda" if self.device.cuda else "cpu"

    @property
    def env(self) -> dict:
        return child_env(cuda=self.device.cuda)


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


# ---------------------------------------------------------------- one submission


def grade_submission(sub: Submission, build: BuildResult, ctx: GradeContext) -> SubmissionResult:
    """Everything after the build, for one submission; never raises for the submission's faults.

    Its wall time is the build's plus its own stages', not the time it waited for the GPU."""
    started = time.monotonic() - build.elapsed_s
    role = "calibration" if ctx.calibration and sub.role is Role.STUDENT else sub.role.value
    base = dict(id=sub.id, label=_label(sub), kind=sub.kind.value, role=role, build=build,
                source_text=_read_source(sub))
    if build.status is not Status.PASS:
        return _finish(base, build.status, build.message, cases=[], started=started)

    runnable, skipped, notes = _select_cases(sub, ctx)
    if not runnable:
        message = ("compiled; not run: no CUDA device" if sub.kind is Kind.CUDA
                   else "imported; no case small enough to run without a GPU")
        return _finish(base, Status.NOT_RUN, message, cases=skipped, notes=notes,
                       started=started)

    with tempfile.TemporaryDirectory(prefix=f"grade-{sub.module_name}-", dir=_scratch()) as tmp:
        work = Path(tmp)
        ctx.progress.stage(sub.id, "run")
        runs, run_proc = run_cases(sub, build, runnable, ctx, work)
        _save_log(ctx, sub, "run", run_proc)
        if any(r["status"] == "pass" for r in runs.values()):
            ctx.progress.stage(sub.id, "check")
            checked = check_outputs(runnable, runs, out_dir=work, device=ctx.device_name,
                                    limits=ctx.limits, env=ctx.env)
        else:
            checked = [CaseResult(c.id, Status(runs[c.id]["status"]), runs[c.id]["message"],
                                  c.hidden, run_s=runs[c.id].get("elapsed_s"),
                                  launched=launched_of(runs[c.id])) for c in runnable]
    if any(c.status in (Status.RUNTIME_ERROR, Status.TIMEOUT) for c in checked):
        ensure_gpu_healthy(ctx)

    cases = _in_case_order(checked + skipped, ctx.cases)
    status = worst(c.status for c in checked)
    if not ctx.sandbox.active:
        notes.append(ctx.sandbox.describe())
    source = _folder_source(sub)   # where the names of the submission's own kernels are defined
    flagged = launch_findings([(c.case, c.launched) for c in cases], source, ctx)
    if flagged and ctx.calibration:
        notes.append(f"calibration run: library calls allowed ({flagged})")
    elif flagged:
        return _finish(base, Status.FLAGGED, flagged, cases=cases, notes=notes, started=started)
    timing, timed_case = None, None
    if status is Status.PASS and ctx.device.cuda:
        ctx.progress.stage(sub.id, "time")
        timed = largest(list(ctx.cases))
        timing_or_error = time_target(_target(sub, build), timed, ctx, writable=_writable(sub, ctx))
        if isinstance(timing_or_error, TimedRun):
            timing, timed_case = timing_or_error.stats, timed.id
            in_loop = launch_findings([(f"{timed.id} (timed calls)", timing.launched)], source, ctx)
            if in_loop and not ctx.calibration:
                return _finish(base, Status.FLAGGED, in_loop, cases=cases, timing=timing,
                               timed_case=timed_case, notes=notes, started=started)
            if timing_or_error.finding:
                return _finish(base, Status.FLAGGED, timing_or_error.finding, cases=cases,
                               timing=timing, timed_case=timed_case, notes=notes, started=started)
        else:
            status, message = timing_or_error
            return _finish(base, status, message, cases=cases, notes=notes,
                           started=started)
    elif status is Status.PASS:
        notes.append("not timed: no CUDA device")
    return _finish(base, status, _verdict(status, cases, timing), cases=cases,
                   timing=timing, timed_case=timed_case, notes=notes, started=started)


def launch_findings(launches: list[tuple[str, tuple]], source: str, ctx: GradeContext) -> str:
    """The verdict's text when any call, (where, [(name, count)]), ran library kernels or
    operators, else ''."""
    own = own_kernel_names(source)
    flags = {}
    for where, launched in launches:
        for flag in classify_launched(launched, own, gpu=ctx.device.cuda):
            flags.setdefault(flag.name, (where, flag))
    if not flags:
        return ""
    what = "GPU kernels" if ctx.device.cuda else "PyTorch operators"
    lines = [f"launched {what} that the submission did not write (the assignment is to write "
             f"the kernel, not to call a library):"]
    lines += [f"  {flag.describe()} in case {case}" for case, flag in list(flags.values())[:8]]
    evidence = static_evidence(source)
    if evidence:
        lines.append("source lines that call a library: " + "; ".join(evidence))
    return "\n".join(lines)


def _writable(sub: Submission, ctx: GradeContext) -> list[Path]:
    """What a submission's own processes may write inside the sandbox."""
    return [sub.path, ctx.build_dir / sub.module_name]


def _read_source(sub: Submission) -> str | None:
    try:
        return sub.source.read_text(errors="replace") if sub.kind is not Kind.INVALID else None
    except OSError:
        return None


def _folder_source(sub: Submission, limit: int = 2_000_000) -> str:
    """Every source file of the submission's folder (a Python submission may import its own
    modules): where its kernels' names are looked up."""
    texts = []
    for path in sorted(sub.path.rglob("*")):
        if path.suffix in (".py", ".cu", ".cuh", ".h", ".hpp", ".cpp") and path.is_file():
            try:
                texts.append(path.read_text(errors="replace")[:limit])
            except OSError:
                continue
    return "\n".join(texts)


def _finish(base: dict, status: Status, message: str, *, cases, started: float,
            notes=(), timing=None, timed_case=None) -> SubmissionResult:
    base = dict(base)
    source = base.pop("source_text", None)
    return SubmissionResult(**base, status=status, message=message,
                            hint=hint_for(base["build"], cases, source), cases=tuple(cases),
                            timing=timing, timed_case=timed_case, notes=tuple(notes),
                            wall_s=round(time.monotonic() - started, 2), graded_at=now())


def _verdict(status: Status, cases: list[CaseResult], timing: TimingStats | None) -> str:
    ran = [c for c in cases if c.status is not Status.NOT_RUN]
    passed = [c for c in ran if c.status is Status.PASS]
    if status is Status.PASS:
        text = f"all {len(ran)} cases run pass"
        if timing:
            text += f"; median {timing.median_ms:.3f} ms ({timing.tflops:.1f} TFLOP/s)"
        return text
    first = next(c for c in cases if c.status is status)
    reason = first.message.splitlines()[0] if first.message else status.value
    return f"{status.value} on case {first.case}: {reason} ({len(passed)} of {len(ran)} cases pass)"


def _label(sub: Submission) -> str:
    return "Reference solution" if sub.role is Role.BASELINE else sub.id


def _select_cases(sub: Submission, ctx: GradeContext) -> tuple[list[Case], list[CaseResult], list[str]]:
    """Which cases can run here: all of them with a GPU; without one, small cases of Python
    submissions only."""
    if ctx.device.cuda:
        return list(ctx.cases), [], []
    if sub.kind is Kind.CUDA:
        return [], [CaseResult(c.id, Status.NOT_RUN, "not run: no CUDA device", c.hidden)
                    for c in ctx.cases], ["compile-checked only: no CUDA device"]
    small = [c for c in ctx.cases if c.flops <= config.CPU_MAX_FLOPS]
    big = [CaseResult(c.id, Status.NOT_RUN, "not run: too large for the CPU (no CUDA device)",
                      c.hidden) for c in ctx.cases if c.flops > config.CPU_MAX_FLOPS]
    notes = [f"ran on the CPU: {len(small)} of {len(ctx.cases)} cases (no CUDA device)"]
    return small, big, notes


def _in_case_order(results: list[CaseResult], cases) -> list[CaseResult]:
    order = {c.id: i for i, c in enumerate(cases)}
    return sorted(results, key=lambda r: order.get(r.case, len(order)))


def _scratch(need_bytes: int = 8 << 30) -> str | None:
    """Outputs are large (512 MiB on the largest case): keep them in memory where there is room
    (/dev/shm is often a small tmpfs in containers), else in the default temporary folder."""
    try:
        st = os.statvfs("/dev/shm")
        if os.access("/dev/shm", os.W_OK) and st.f_bavail * st.f_frsize >= need_bytes:
            return "/dev/shm"
    except OSError:
        pass
    return None


def _save_log(ctx: GradeContext, sub: Submission, stage: str, proc: ProcResult) -> None:
    path = ctx.out_dir / "logs" / f"{sub.id}.{stage}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(proc.output)


def _target(sub: Submission, build: BuildResult | None) -> dict:
    if sub.kind is Kind.CUDA:
        return dict(kind="cuda", artifact=build.artifact, module_name=sub.module_name)
    if sub.kind is Kind.PYTHON:
        return dict(kind="python", source=str(sub.source))
    return dict(kind="builtin", name=sub.id)


# ---------------------------------------------------------------- stages in child processes


def run_cases(sub: Submission, build: BuildResult, cases: list[Case], ctx: GradeContext,
              work: Path) -> tuple[dict[str, dict], ProcResult]:
    """Run the submission on every case in its own process; one record per case."""
    events = work / "events.jsonl"
    spec = dict(target=_target(sub, build), device=ctx.device_name, out_dir=str(work),
                events=str(events), cases=[c.to_dict() for c in cases])
    spec_path = work / "run_spec.json"
    spec_path.write_text(json.dumps(spec))
    cmd = ctx.sandbox.wrap([sys.executable, "-m", "grader.worker", "run", "--spec", str(spec_path)],
                           writable=[*_writable(sub, ctx), work])
    proc = run_limited(cmd, timeout_s=ctx.limits.run_s, env=ctx.env, cwd=sub.path,
                       head_bytes=ctx.limits.output_head_bytes,
                       tail_bytes=ctx.limits.output_tail_bytes,
                       file_bytes=int(ctx.limits.file_gb * (1 << 30)))
    return interpret_events(cases, _read_events(events), proc, ctx.limits.run_s), proc


def _read_events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            break   # a torn last line: the process died while writing it
    return events


def interpret_events(cases: list[Case], events: list[dict], proc: ProcResult,
                     limit_s: float) -> dict[str, dict]:
    """Turn the worker's event log and exit into one record per case:
    {'status': 'pass' (ran; to be checked) | 'runtime_error' | 'timeout', 'message', 'elapsed_s'}."""
    last: dict[str, dict] = {}
    for e in events:
        last[e["case"]] = e
    records: dict[str, dict] = {}
    died = None   # the first case that never finished: where the process died or hung
    for case in cases:
        e = last.get(case.id)
        if e is None:
            if died is None:
                died = case.id
                records[case.id] = _death_record(proc, limit_s, loading=not events)
            else:
                records[case.id] = dict(status="runtime_error",
                                        message=f"not run: the process ended during case {died}")
        elif e["event"] == "done":
            records[case.id] = dict(status="pass", message="", elapsed_s=e["elapsed_s"],
                                    peak_memory_bytes=e.get("peak_memory_bytes"),
                                    launched=e.get("launched", []))
        elif e["event"] == "error":
            records[case.id] = dict(status="runtime_error",
                                    message=f"{e['error']}: {e['message']}\n{e['traceback']}")
        elif e["event"] == "skipped":
            records[case.id] = dict(status="runtime_error", message=e["message"])
        else:   # started, never finished
            died = died or case.id
            records[case.id] = _death_record(proc, limit_s, loading=False)
    return records


def _death_record(proc: ProcResult, limit_s: float, *, loading: bool) -> dict:
    doing = "loading the submission" if loading else "this case"
    if proc.timed_out:
        return dict(status="timeout", message=f"still running after {limit_s:.0f} s ({doing}); killed")
    how = f"was killed by {proc.signal_name}" if proc.signal_name else f"exited with code {proc.returncode}"
    exception = proc.last_exception()
    return dict(status="runtime_error", message=f"the process {how} while {doing}"
                f"{': ' + exception if exception else ''}\n{proc.tail(25)}")


@dataclasses.dataclass(frozen=True)
class TimedRun:
    stats: TimingStats
    finding: str = ""    # why the timing cannot be trusted: clocks disagree, a timed output is wrong


def time_target(target: dict, case: Case, ctx: GradeContext, *,
                writable: list[Path] = ()) -> TimedRun | tuple[Status, str]:
    """Timing statistics of one case, from a fresh process, with its two integrity checks (the
    two clocks, and the sampled timed calls' outputs); or (status, message) if it failed."""
    with tempfile.TemporaryDirectory(prefix="time-", dir=_scratch()) as tmp:
        out = Path(tmp) / "timing.json"
        spec = dict(target=target, device=ctx.device_name, case=case.to_dict(),
                    budget_s=ctx.limits.time_budget_s, l2_bytes=ctx.device.l2_bytes, out=str(out),
                    record_launches=config.TIMING_RECORD_LAUNCHES)
        spec_path = Path(tmp) / "time_spec.json"
        spec_path.write_text(json.dumps(spec))
        cwd = target.get("source") and Path(target["source"]).parent or config.REPO_ROOT
        cmd = ctx.sandbox.wrap([sys.executable, "-m", "grader.worker", "time", "--spec", str(spec_path)],
                               writable=[*writable, tmp])
        proc = run_limited(cmd, timeout_s=ctx.limits.time_s, env=ctx.env, cwd=cwd,
                           head_bytes=ctx.limits.output_head_bytes,
                           tail_bytes=ctx.limits.output_tail_bytes,
                       file_bytes=int(ctx.limits.file_gb * (1 << 30)))
        if proc.timed_out:
            ensure_gpu_healthy(ctx)
            return Status.TIMEOUT, f"timing {case.id} did not finish within {ctx.limits.time_s:.0f} s"
        if not proc.ok or not out.exists():
            ensure_gpu_healthy(ctx)
            return Status.RUNTIME_ERROR, f"timing {case.id} failed:\n{proc.tail(25)}"
        record = json.loads(out.read_text())
        stats = TimingStats.from_dict(record["stats"])
        finding = clocks_disagree(stats.median_ms, stats.wall_median_ms) or ""
        if target["kind"] != "builtin":
            spots = check_spots(case, record["spots"], out_dir=Path(tmp), device=ctx.device_name,
                                limits=ctx.limits, env=ctx.env)
            wrong = [s for s in spots if not s.ok]
            if not spots:
                finding = finding or "no timed call's output could be kept for the check"
            elif wrong:
                finding = (f"timed call {wrong[0].call + 1} of {stats.n} returned a wrong output "
                           f"({len(wrong)} of the {len(spots)} calls checked at random): outputs "
                           f"cached or replayed across calls, or work left running after the "
                           f"call returned.\n{wrong[0].message}")
        return TimedRun(stats, finding)


def ensure_gpu_healthy(ctx: GradeContext, *, tries: int = 2) -> None:
    """After a crash or a kill, make sure the next submission gets a working GPU."""
    if not ctx.device.cuda:
        return
    probe = ("import torch; x = torch.ones(1 << 20, device='cuda'); "
             "assert float(x.sum()) == float(1 << 20); torch.cuda.synchronize()")
    for attempt in range(tries):
        proc = run_limited([sys.executable, "-c", probe], timeout_s=120, env=ctx.env)
        if proc.ok:
            return
        time.sleep(5 * (attempt + 1))
    raise GpuUnhealthy(f"the GPU failed its health check after a submission:\n{proc.tail(15)}")


# ---------------------------------------------------------------- baselines


def grade_baseline(name: str, ctx: GradeContext) -> SubmissionResult:
    """A PyTorch baseline row: timed on the largest case by the same code as the submissions."""
    started = time.monotonic()
    baseline = BASELINES[name]
    base = dict(id=name, label=baseline.label, kind="builtin", role="baseline")
    if not ctx.device.cuda:
        return SubmissionResult(**base, status=Status.NOT_RUN, message="not run: no CUDA device",
                                graded_at=now())
    case = largest(list(ctx.cases))
    timed = time_target(dict(kind="builtin", name=name), case, ctx)
    if isinstance(timed, TimedRun):
        timing = timed.stats
        return SubmissionResult(**base, status=Status.PASS,
                                message=f"median {timing.median_ms:.3f} ms ({timing.tflops:.1f} TFLOP/s)",
                                timed_case=case.id, timing=timing, graded_at=now(),
                                wall_s=round(time.monotonic() - started, 2))
    status, message = timed
    return SubmissionResult(**base, status=status, message=message, graded_at=now(),
                            wall_s=round(time.monotonic() - started, 2))


# ---------------------------------------------------------------- all of them


def grade_all(subs: list[Submission], ctx: GradeContext, *, baselines: list[str],
              build_jobs: int) -> list[SubmissionResult]:
    """Builds run `build_jobs` at a time; the GPU stages run one submission at a time, in the
    order the builds finish. PyTorch baselines are timed while the first builds compile."""
    results: list[SubmissionResult] = []

    def record(result: SubmissionResult) -> None:
        write_result(ctx.out_dir, result)
        results.append(result)
        ctx.progress.done(result)

    def build(sub: Submission) -> BuildResult:
        ctx.progress.stage(sub.id, "build")
        return build_submission(sub, build_dir=ctx.build_dir / sub.module_name, device=ctx.device,
                                limits=ctx.limits, sandbox=ctx.sandbox,
                                log_path=ctx.out_dir / "logs" / f"{sub.id}.build.log")

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, build_jobs)) as pool:
        futures = {pool.submit(build, s): s for s in subs}
        for name in baselines:
            ctx.progress.stage(name, "time")
            record(grade_baseline(name, ctx))
        for future in concurrent.futures.as_completed(futures):
            sub = futures[future]
            try:
                build_result = future.result()
            except Exception as e:   # a grader bug must not stop the other submissions
                build_result = BuildResult(Status.BUILD_ERROR, "none", 0.0,
                                           message=f"grader error while building: {e!r}")
            started = time.monotonic()
            try:
                result = grade_submission(sub, build_result, ctx)
            except GpuUnhealthy:
                raise
            except Exception as e:   # a grader bug: this submission's result says so, then go on
                result = SubmissionResult(id=sub.id, label=_label(sub), kind=sub.kind.value,
                                          role=sub.role.value, status=Status.RUNTIME_ERROR,
                                          message=f"grader error: {e!r}; tell the instructor",
                                          build=build_result, graded_at=now(),
                                          wall_s=round(time.monotonic() - started, 2))
            record(result)
    return results

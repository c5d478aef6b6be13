"""Grade submissions: build (in parallel on the CPU cores) -> run -> check -> time (on each GPU,
run and check stages of up to config.GPU_LANES submissions at once, every time stage alone:
grader/gate.py) -> one result file each, written the moment it is known."""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import datetime
import errno
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from pathlib import Path
from typing import NamedTuple

from . import allowlist, config, identity, reach
from .baselines import BASELINES
from .build import (NOT_YOURS, STUDENT_OBJECT, BuildResult, StudentCheck, build_submission,
                    machine_load)
from .build_cache import BuildCache
from .cases import Case, largest
from .correctness import CaseResult, check_outputs, launched_of
from .device import DeviceInfo, device_minor
from .gate import BuildThrottle, GpuGate, alone, shared
from .feedback import cpu_note
from .hints import hint_for
from .integrity import (TimingFinding, classify_launched, static_evidence, tampering_lines,
                        timing_findings)
from .procs import (Cancelled, CpuSplit, cancel_all, child_env, default_build_jobs,
                    end_processes, gpu_worker, process_tree, run_limited, set_gpu_workers,
                    spawn_capped, split_cpus, started_at, stopping)
from .progress import Progress
from .quota import QUOTA
from .results import GpuRef, SubmissionResult, write_json_atomic, write_result
from .runs import RunJournal, plan_run, scratch_dir
from .sandbox import Sandbox, give_to_sandbox
from .status import Status, worst
from .submission import Kind, Role, Submission, read_sources, source_text
from .text import clean, clean_line
from .timing import ProtocolCost, TimingStats

SUBJECT = Path(__file__).resolve().parent / "subject" / "loop.py"


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
    precision: tuple[float, float] = (config.PRECISION_FACTOR, config.PRECISION_FLOOR)
    protocol: ProtocolCost = ProtocolCost()   # the protocol's own cost per timed call (calibrate_protocol)
    build_cache: BuildCache | None = None     # CUDA builds reused when unchanged (grader/build_cache.py)
    # The run's GPUs, one GPU worker each (worker_contexts); `device` is the first, or, in a
    # worker's context, its own (the `slot`-th). Empty or one: one worker, as before workers.
    gpus: tuple[DeviceInfo, ...] = ()
    slot: int = 0
    # Run and check stages of this many submissions at once on a GPU, each time stage alone
    # (config.GPU_LANES; grade --lanes); a worker's context holds its GPU's gate when above 1.
    lanes: int = 1
    gate: GpuGate | None = None
    # A student's `check` on their own machine, not a course's `grade`: a build's messages speak
    # of this machine and name the limit to raise, and it reports its progress (build.StudentCheck).
    student_check: bool = False

    @property
    def device_name(self) -> str:
        return "cuda" if self.device.cuda else "cpu"

    @property
    def env(self) -> dict:
        """Every child's environment; its CUDA sees only this context's GPU."""
        return child_env(cuda=self.device.cuda, gpu=self.device.uuid)

    @property
    def workers(self) -> int:
        return max(1, len(self.gpus))

    @property
    def run_cpus(self) -> CpuSplit:
        """Where a run stage's harness and subject run: on the GPU stages' CPUs; when run stages
        share the GPU (lanes), on the builds' (idle in a regrade), leaving the GPU stages' three
        to the time stages and the checker. Session 16's lanes ran three run stages on those
        three, and their run stages took 5.5 s against 3.7 s (notes/throughput.md)."""
        cpus = self.cpus
        return cpus if self.gate is None else dataclasses.replace(cpus, gpu=cpus.build)

    @property
    def lookahead(self) -> int:
        """How many of a lane's next submissions are begun early (Lookahead): one per lane when
        run stages share the GPU, each with its run's and its time stage's subjects."""
        return 1 if self.gate is not None else config.LOOKAHEAD

    @property
    def cpus(self) -> CpuSplit:
        """Where the GPU stages and the builds run (procs.split_cpus): calibration and every timed
        call see the same quiet CPUs, whatever compiles meanwhile; with several GPU workers, each
        its own."""
        if self.workers == 1:
            return split_cpus(self.limits.gpu_stage_cpus)
        return split_cpus(self.limits.gpu_stage_cpus, workers=self.workers, slot=self.slot)

    @property
    def gpu_tag(self) -> str:
        """'' for the run's first GPU (its results where they always were), 'gpu<index>' for
        another's copies of the baselines and protocol cost."""
        return f"gpu{self.device.index}" if self.slot and self.device.index is not None else \
            (f"gpu-slot{self.slot}" if self.slot else "")

    @property
    def gpu_ref(self) -> GpuRef | None:
        """What a result graded in this context records of its GPU."""
        d = self.device
        return GpuRef(index=d.index, name=d.name, uuid=d.uuid) if d.cuda else None


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


# ---------------------------------------------------------------- one submission


def run_cases_under_load(sub: Submission, build: BuildResult, cases: list[Case], ctx: GradeContext,
                         work: Path, jit: Path | None = None, timed: Case | None = None,
                         prepared: "Prepared | None" = None) -> Ran:
    """run_cases, and the build stage's rule for a machine too busy to tell slow from hung
    (config.OVERLOADED_PER_CORE): a timeout on a machine that was overloaded before the cases
    started is run once more; a second one, the load again that high before it, is the machine's
    (environment_error: never scored). The load is read before each try, never during one: a
    hung submission's own threads cannot make its timeout the machine's."""
    load = machine_load()   # before: while the cases run, the submission adds to the load
    ran = run_cases(sub, build, cases, ctx, work, jit, timed, prepared)
    if not _timed_out(ran.runs) or load < config.OVERLOADED_PER_CORE:
        return ran
    if ran.stages is not None:
        ran.stages.close()
    ctx.progress.note(f"{sub.id}: a case timed out while the machine was overloaded (load "
                      f"{load:.1f} per core); running the cases again")
    load = min(load, machine_load())
    ran = run_cases(sub, build, cases, ctx, work, jit, timed)
    if _timed_out(ran.runs) and load >= config.OVERLOADED_PER_CORE:
        for r in ran.runs.values():
            if r["status"] == Status.TIMEOUT.value:
                r["status"] = Status.ENVIRONMENT_ERROR.value
                r["message"] += (f" (twice, both times while the grading machine was overloaded, "
                                 f"load {load:.1f} per core: the machine's fault, not your "
                                 f"submission's; it will be graded again)")
    return ran


def _timed_out(runs: dict) -> bool:
    return any(r.get("status") == Status.TIMEOUT.value for r in runs.values())


def grade_submission(sub: Submission, build: BuildResult, ctx: GradeContext,
                     source: str = "") -> SubmissionResult:
    """Everything after the build, for one submission; never raises for the submission's faults.
    `source`: its folder's sources, read before any of its code ran (own kernel names).

    Its wall time is the build's plus its own stages', not the time it waited for the GPU.
    In a GPU worker, its run may have begun during the submission before (Lookahead)."""
    turn = time.monotonic()
    waits = _AHEAD.begun(sub)   # only a run begun early is waited for ("wait" in stage_s)
    prepared = _AHEAD.claim(sub, ctx.gate)   # waits for its preparation to end, if it has not
    if prepared is not None:
        try:
            with prepared.folders:
                return _over_quota(_grade_built(sub, build, ctx, source, prepared.jit, prepared,
                                                time.monotonic() - turn), prepared.jit)
        except NotStarted as gone:   # graded anew below, in new folders, its time counted as waiting
            waits = True
            ctx.progress.note(f"{sub.id}: its run begun early did not start; running it anew"
                              + _harness_said(gone.output))
    # Nothing else counts as waiting: on a loaded machine even a turn with nothing begun early
    # takes over a millisecond to get here (CI's 2-core machine), and making the JIT folder is
    # the run stage's work.
    waited_s = time.monotonic() - turn if waits else 0.0
    with jit_cache(sub, ctx.limits) as jit:
        return _over_quota(_grade_built(sub, build, ctx, source, jit, waited_s=waited_s), jit)


def _over_quota(result: SubmissionResult, jit: Path | None) -> SubmissionResult:
    """`result`, unless its JIT cache went over its limits (grader/quota.py): then that is the
    verdict, whatever its stages made of their killed processes, and it is not timed."""
    watch = QUOTA.over(jit)
    if watch is None:
        return result
    return dataclasses.replace(result, status=Status.RUNTIME_ERROR,
                               message=watch.message("its JIT cache folder"), timing=None,
                               timed_case=None)


def _harness_said(output: str) -> str:
    """A note's tail: the last lines of a harness that ended with no record, if any."""
    tail = "\n".join(output.strip().splitlines()[-15:])
    return f"; its harness said:\n{tail}" if tail else ""


class NotStarted(Exception):
    """A run begun early (Lookahead) whose harness ended on its turn without a record: it gave
    up (harness._give_up: its subject was gone before loading anything) or failed. Nothing of the
    submission's ran to a result: grade_submission grades it anew, in new folders."""

    def __init__(self, output: str):
        super().__init__("a run begun early did not start")
        self.output = output


@contextlib.contextmanager
def _held(hold, gate: GpuGate | None, clock: "StageClock"):
    """hold(gate), gate.shared or gate.alone, with the time its turn took as "wait" on the clock.
    Without a gate nothing is waited for and nothing is counted (a loaded machine's scheduling
    is no wait)."""
    asked = time.monotonic()
    with hold(gate) as held:
        if gate is not None:
            clock.waited(time.monotonic() - asked)
        yield held


def _grade_built(sub: Submission, build: BuildResult, ctx: GradeContext, source: str,
                 jit: Path | None, prepared: "Prepared | None" = None,
                 waited_s: float = 0.0) -> SubmissionResult:
    """grade_submission, with the submission's JIT cache folder (jit_cache) and, when its run
    was begun early, the Prepared (its work folder and Stages); waited_s: how long its turn
    waited for a preparation to end (StageClock "wait")."""
    started = time.monotonic() - build.elapsed_s - waited_s
    clock = StageClock(build.elapsed_s)
    clock.waited(waited_s)
    role = "calibration" if ctx.calibration and sub.role is Role.STUDENT else sub.role.value
    base = dict(id=sub.id, label=_label(sub), kind=sub.kind.value, role=role, build=build,
                source_text=_read_source(sub), stage_s=clock,
                review=() if ctx.calibration else audit_review(sub, build, source),
                audit_notes=tuple(getattr(build, "audit_notes", ()) or ()))
    if build.status is not Status.PASS:
        return _finish(base, build.status, build.message, cases=[], started=started)

    runnable, skipped, notes = _select_cases(sub, ctx)
    if not runnable:
        message = ("compiled; not run: no CUDA device" if sub.kind is Kind.CUDA
                   else "imported; no case small enough to run without a GPU")
        return _finish(base, Status.NOT_RUN, message, cases=skipped, notes=notes,
                       started=started)

    # The solution is graded on every GPU of the run: each GPU's logs of it apart.
    log_id = f"{sub.id}.{ctx.gpu_tag}" if ctx.gpu_tag and sub.role is Role.BASELINE else sub.id
    timed = largest(list(ctx.cases)) if ctx.device.cuda else None
    folder = contextlib.nullcontext(prepared.work) if prepared is not None else _work_folder(sub)
    with folder as tmp, contextlib.ExitStack() as later:
        work = Path(tmp)
        timer = None
        if ctx.gate is not None and timed is not None:   # its time stage on a subject of its own
            timer = prepared.timer if prepared is not None and prepared.timer is not None \
                else time_subject(sub, build, ctx, timed, work, jit)
            later.callback(timer.close)
        with _held(shared, ctx.gate, clock) as company:
            ctx.progress.stage(sub.id, "run")
            clock.start("run")
            runs, run_output, stages, phases_s = run_cases_under_load(sub, build, runnable, ctx,
                                                                      work, jit, timed, prepared)
            if stages is not None and ctx.gate is not None:
                _let_go(stages, jit)   # gone before the gate is let go: timed on `timer`
                stages = None
            elif stages is not None:
                later.callback(stages.close)
            clock.parts("run", phases_s)
            _save_log(ctx, log_id, "run", run_output)
            checked = _check(sub, runnable, runs, ctx, work, clock)
        if company.crowded and any(c.status in CROWDED_RETRY for c in checked):
            # Another submission ran beside it and could have taken the GPU's memory or time:
            # its cases run again with the GPU to themselves before they count.
            ctx.progress.note(f"{sub.id}: a case failed while other submissions' run stages "
                              f"shared the GPU; running its cases again alone")
            with alone(ctx.gate):
                clock.start("run")
                runs, run_output, _, _ = run_cases(sub, build, runnable, ctx, work, jit)
                _save_log(ctx, log_id, "run", run_output)
                checked = _check(sub, runnable, runs, ctx, work, clock)
        return _judged(sub, build, ctx, source, jit, base=base, started=started, clock=clock,
                       checked=checked, skipped=skipped, notes=notes, log_id=log_id,
                       timed=timed, stages=stages, timer=timer)


def _check(sub: Submission, cases: list[Case], runs: dict, ctx: GradeContext, work: Path,
           clock: "StageClock") -> list[CaseResult]:
    """The check stage: the outputs of the cases that ran, checked by the warm checker; a
    CaseResult per case (a case that did not run keeps its run's verdict)."""
    if any(r["status"] == "pass" for r in runs.values()):
        ctx.progress.stage(sub.id, "check")
        clock.start("check")
        checked = check_outputs(cases, runs, out_dir=work, device=ctx.device_name,
                                limits=ctx.limits, env=ctx.env, precision=ctx.precision)
    else:
        checked = [CaseResult(c.id, Status(runs[c.id]["status"]), runs[c.id]["message"],
                              c.hidden, run_s=runs[c.id].get("elapsed_s"),
                              launched=launched_of(runs[c.id])) for c in cases]
    clock.stop()
    return checked


# A case that ended so while other submissions' run stages shared the GPU is run again alone:
# they could have taken its memory, its time or the machine's CPUs (the load rule's verdict).
CROWDED_RETRY = (Status.RUNTIME_ERROR, Status.TIMEOUT, Status.ENVIRONMENT_ERROR)


def _failed_to_run(checked: list[CaseResult]) -> bool:
    return any(c.status in (Status.RUNTIME_ERROR, Status.TIMEOUT) for c in checked)


def _let_go(stages: "Stages", jit: Path | None) -> None:
    """A run stage's harness and subject ended, and each of their processes exited
    (WarmHarness.close), before the stage lets go of its GPU's gate (gate.py's invariant: no
    process that ran a submission's code holds a CUDA context when a time stage may begin). What
    it tuned beside other submissions' run stages is forgotten (_forget_tuning)."""
    stages.close()
    if stages.harness.left:
        raise GpuUnhealthy(f"processes {sorted(stages.harness.left)} of a run stage were still "
                           f"running 60 s after they were killed: no time stage can begin beside them")
    _forget_tuning(jit)


# What an autotuner keeps of its choice in a JIT cache folder (Triton's autotune(cache_results)).
TUNING_FILES = ("*.autotune.json",)


def _forget_tuning(jit: Path | None) -> None:
    """An autotuner's choice, measured in a run stage that shared the GPU with other submissions'
    (and so slowed by them, or on purpose by one of them), is not kept for the time stage: its
    subject tunes again in its warm-up calls, alone. Compiled kernels stay."""
    if jit is None:
        return
    for pattern in TUNING_FILES:
        for path in jit.rglob(pattern):
            with contextlib.suppress(OSError):
                path.unlink()


def _judged(sub: Submission, build: BuildResult, ctx: GradeContext, source: str, jit: Path | None,
            *, base: dict, started: float, clock: "StageClock", checked: list[CaseResult],
            skipped: list[CaseResult], notes: list[str], log_id: str, timed: Case | None,
            stages: "Stages | None", timer: "TimeSubject | None" = None) -> SubmissionResult:
    """_grade_built after the check: the verdict from the cases and the kernels they launched,
    then the time stage (on the run's subject when `stages` holds it, on `timer`'s when run
    stages share the GPU) when all passed."""
    status = worst(c.status for c in checked)
    if stages is not None and (status is not Status.PASS or timed is None):
        stages.close()   # not timed: its subject goes before the GPU's health is checked
    if _failed_to_run(checked):
        with alone(ctx.gate):   # no other submission's code beside the probe: its verdict is the GPU's
            ensure_gpu_healthy(ctx)

    cases = _in_case_order(checked + skipped, ctx.cases)
    notes = _ran_where(ctx, cases) + notes
    if not ctx.sandbox.active:
        notes.append(ctx.sandbox.describe())
    own = identity.own_kernels(source, sub.kind.value, getattr(build, "kernels", None))
    kernels = _kernels(cases, None, source, sub, build)
    flagged = launch_findings([(c.case, c.launched) for c in cases], source, own, ctx)
    if flagged and ctx.calibration:
        notes.append(f"calibration run: library calls allowed ({flagged})")
    elif flagged:
        return _finish(base, Status.FLAGGED, flagged, cases=cases, notes=notes, started=started,
                       kernels=kernels)
    timing, timed_case = None, None
    if status is Status.PASS and timed is not None:
        timer = _current(timer, ctx)
        if timer is not None:
            timer.settle()   # its preparation ends before its turn, not in it
        with _held(alone, ctx.gate, clock):
            ctx.progress.stage(sub.id, "time")
            clock.start("time")
            timed_run = time_target(_target(sub, build), timed, ctx, folder=_folder(sub, build),
                                    log_name=log_id, jit=jit, stages=stages, timer=timer)
            clock.stop()
        if isinstance(timed_run, tuple):
            status, message = timed_run
            return _finish(base, status, message, cases=cases, notes=notes, started=started,
                           kernels=kernels)
        timing, timed_case = timed_run.stats, timed.id
        kernels = _kernels(cases, timing, source, sub, build)
        clock.parts("time", timed_run.record.get("phases_s") or {})
        clock.parts("time.loop", timed_run.record.get("loop_s") or {})
        findings = judge_timing(timed_run, timed, source, own, ctx)
        notes += [f.note for f in findings if f.note]   # what is unusual in a time that stands
        problems = [f for f in findings if f.status != Status.PASS.value]
        if problems:
            worst_status = worst(Status(f.status) for f in problems)
            message = "\n".join(f.message for f in problems if f.status == worst_status.value)
            if any(f.impossible_time for f in problems):
                timing = None   # no page shows an impossible rate
            if worst_status is Status.REVIEW:   # the timed calls' own reason for a review
                base = {**base, "review": tuple(base.get("review", ())) + (message,)}
                message = _verdict(Status.PASS, cases, timing)
                worst_status = Status.PASS      # identity.with_review makes it `review`
            return _finish(base, worst_status, message, cases=cases, timing=timing,
                           timed_case=timed_case, notes=notes, started=started, kernels=kernels)
    elif status is Status.PASS:
        notes.append("not timed: no CUDA device")
    return _finish(base, status, _verdict(status, cases, timing), cases=cases,
                   timing=timing, timed_case=timed_case, notes=notes, started=started,
                   kernels=kernels)


def _kernels(cases: list[CaseResult], timing: TimingStats | None, source: str, sub: Submission,
             build: BuildResult) -> tuple:
    """The kernels for the review queue: the timed calls' (with their GPU time), else the
    largest profiled case's (counts only)."""
    if timing is not None and timing.launched:
        launched = timing.launched
    else:
        profiled = [c for c in cases if c.launched]
        launched = [(name, count, 0.0) for name, count in profiled[-1].launched] if profiled else []
    return identity.kernel_shares(launched, source, sub.kind.value, getattr(build, "kernels", None))


def judge_timing(timed: "TimedRun", case: Case, source: str, own, ctx: GradeContext) -> list:
    """Every reason the timed calls cannot rank (trusted observations, then the kernels the
    subject reported), or [] when the time stands. `own`: the submission's own kernel names
    (identity.own_kernels)."""
    problems = timing_findings(timed.record, timed.stats, own, flops=case.flops,
                               peak_tflops=ctx.device.matmul_tflops,
                               library_allowed=ctx.calibration)
    in_loop = launch_findings([(f"{case.id} (timed calls)", timed.stats.launched)], source, own, ctx)
    if in_loop and not ctx.calibration:
        problems.append(TimingFinding("flagged", in_loop))
    return problems


def launch_findings(launches: list[tuple[str, tuple]], source: str, own,
                    ctx: GradeContext) -> str:
    """The verdict's text when any call, (where, [(name, count)]), ran library kernels or
    operators, else ''. `own`: the submission's own kernel names (identity.own_kernels)."""
    flags = {}
    for where, launched in launches:
        for flag in classify_launched([item[:2] for item in launched], own, gpu=ctx.device.cuda):
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


def tampering_verdict(source: str) -> str:
    """The flag's text when the sources use an API on integrity.TAMPERING, else ''."""
    lines = tampering_lines(source)
    if not lines:
        return ""
    return ("uses APIs that no kernel needs and that tamper with grading (the profiler, other "
            "frames or objects, helper processes, the compiler stack, raw memory or pipes); "
            "remove them: " + "; ".join(lines))


def source_verdict(sub: Submission, source: str) -> str:
    """The flag's text for what the sources alone show, before anything is built or run: the
    tampering scan and, for Python, the known ways in that the audit of every file finds
    (grader/allowlist.py). A CUDA build's includes are the compiler's, checked with its object
    (audit_build). '' when there is nothing to flag."""
    texts = [tampering_verdict(source)]
    if sub.kind is Kind.PYTHON:
        texts.append(reach.verdict(list(allowlist.audit_folder(source, sub.path).flagged)))
    return "\n".join(t for t in texts if t)


def audit_review(sub: Submission, build: BuildResult | None, source: str) -> tuple[str, ...]:
    """What the audit could not account for (identity.with_review makes a pass of such a
    submission `review`): for Python, the allowlist's findings on its files; for C++, what the
    audit of its build found (BuildResult.review)."""
    if sub.role is not Role.STUDENT:
        return ()
    if sub.kind is Kind.PYTHON:
        return identity.python_review(source)
    return tuple(getattr(build, "review", ()) or ())


def audit_build(sub: Submission, built: BuildResult, build_dir: Path, source: str = "") -> BuildResult:
    """A CUDA build that passed, audited before any of its code runs (grader/reach.py): the
    imports of the object compiled from the submission's translation unit and the headers the
    compiler opened (FLAGGED with the symbols or headers), then what an instructor must see
    (native_review: to review, and notes). ENVIRONMENT_ERROR when this machine cannot read object
    files. `source`: read_sources' text of its folder (the notes' text part)."""
    if sub.kind is not Kind.CUDA or built.status is not Status.PASS:
        return built
    try:
        findings = reach.native_reach(build_dir / STUDENT_OBJECT)
        review, notes = reach.native_review(build_dir, source) if not findings else ([], [])
    except (reach.AuditUnavailable, OSError, subprocess.SubprocessError) as e:
        return dataclasses.replace(built, status=Status.ENVIRONMENT_ERROR, message=(
            f"the grading machine cannot audit the build: {e}. {NOT_YOURS}"))
    flagged = reach.verdict(findings)
    if flagged:
        return dataclasses.replace(built, status=Status.FLAGGED, message=flagged)
    return dataclasses.replace(built, review=tuple(f.describe() for f in review),
                               audit_notes=tuple(notes))


def _folder(sub: Submission, build: BuildResult | None) -> list[Path]:
    """What a submission's run and timing processes see of the grader's disk, read-only: its own
    folder and its build folder."""
    if sub.kind is Kind.CUDA and build is not None and build.artifact:
        return [sub.path, Path(build.artifact).parent]
    return [sub.path]


# JIT compilers' caches (Triton's, TileLang's): one folder per submission, written by its run and
# timing processes and seen by no other submission's. The sandbox gives each process a fresh $HOME,
# so the timing process compiled every kernel again: about 8 s of a Triton submission's 28 s
# timing stage on an H100 (session 8, notes/throughput.md). Without the sandbox, submissions shared
# ~/.triton/cache, where one could leave a compiled kernel for another to load. The folder is as
# exposed as a Python submission's build folder is to its import check: writable, on scratch.
JIT_CACHE_VARS = {"TRITON_CACHE_DIR": "triton", "TILELANG_CACHE_DIR": "tilelang"}


@contextlib.contextmanager
def jit_cache(sub: Submission, limits: config.Limits):
    """The submission's JIT cache folder for its GPU stages (None for a CUDA build), watched
    (grader/quota.py: the harnesses given it attach), removed after."""
    if sub.kind is not Kind.PYTHON:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix=f"jit-{sub.module_name}-", dir=_scratch(1 << 30)) as tmp, \
            QUOTA.watch(Path(tmp), int(limits.folder_gb * (1 << 30)), limits.folder_files):
        folder = Path(tmp)
        for name in JIT_CACHE_VARS.values():
            (folder / name).mkdir()
        give_to_sandbox(folder)   # written as the sandbox's user
        yield folder


def jit_env(env: dict, jit: Path) -> dict:
    """A subject's environment with its JIT caches in `jit`."""
    return {**env, **{var: str(jit / name) for var, name in JIT_CACHE_VARS.items()}}


def _read_source(sub: Submission) -> str | None:
    """The submission's file, for its hint (submission.source_text: never blocks, capped)."""
    return source_text(sub) if sub.kind is not Kind.INVALID else None


def _finish(base: dict, status: Status, message: str, *, cases, started: float,
            notes=(), timing=None, timed_case=None, kernels=()) -> SubmissionResult:
    """The result; a passing one that the audit could not account for is `review`
    (identity.with_review)."""
    base = dict(base)
    source = base.pop("source_text", None)
    base["stage_s"] = base["stage_s"].seconds() if "stage_s" in base else ()
    status, message = identity.with_review(status, message, base.get("review", ()))
    return SubmissionResult(**base, status=status, message=clean(message), kernels=kernels,
                            hint=hint_for(base["build"], cases, source), cases=tuple(cases),
                            timing=timing, timed_case=timed_case, notes=tuple(clean(n) for n in notes),
                            wall_s=round(time.monotonic() - started, 2), graded_at=now())


class StageClock:
    """The seconds one submission spent in each stage (the result's stage_s): the build's, then
    each of run, check and time from its start to its stop, then the parts of a stage that its
    process measured ("run.subject": results.RUN_PHASES; "time.loop": TIME_PHASES). The stage's
    own figure holds its parts, except for a run begun early (Lookahead), whose parts up to
    "waiting" overlapped the submission before it. "wait": time spent waiting for a preparation
    to end, or for the GPU's gate when run stages share it (waited)."""

    def __init__(self, build_s: float):
        self._seconds = {"build": build_s}
        self._parts: dict[str, float] = {}
        self._stage, self._since = "", 0.0

    def waited(self, seconds: float) -> None:
        """Time in no stage: waiting for this submission's preparation to end at its turn
        (Lookahead), or for its GPU's gate (gate.py); "wait" in stage_s when there was any."""
        if seconds > 0.001:
            self._seconds["wait"] = self._seconds.get("wait", 0.0) + seconds

    def parts(self, stage: str, seconds: dict[str, float]) -> None:
        self._parts.update({f"{stage}.{part}": s for part, s in seconds.items()})

    def start(self, stage: str) -> None:
        self.stop()
        self._stage, self._since = stage, time.monotonic()

    def stop(self) -> None:
        if self._stage:
            self._seconds[self._stage] = time.monotonic() - self._since
            self._stage = ""

    def seconds(self) -> tuple[tuple[str, float], ...]:
        self.stop()
        return tuple((stage, round(s, 3)) for stage, s in {**self._seconds, **self._parts}.items())


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
    if not ran:   # not_run: none of the cases it was given ran (TileLang without a GPU)
        return f"{reason} (none of its {len(cases)} cases ran)"
    return f"{status.value} on case {first.case}: {reason} ({len(passed)} of {len(ran)} cases pass)"


def _label(sub: Submission) -> str:
    return "Reference solution" if sub.role is Role.BASELINE else clean_line(sub.id)


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
    # No note yet: what ran is known once the cases have (_ran_where). A case given to the CPU
    # need not run there: TileLang, with no CPU interpreter, compiles it and runs nothing.
    return small, big, []


def _ran_where(ctx: GradeContext, cases: list[CaseResult]) -> list[str]:
    """Without a CUDA device, the note that says how many cases ran, on the CPU, when any did
    (feedback.cpu_note: the label CPU-PASS reads it); none when none ran."""
    ran = sum(c.status is not Status.NOT_RUN for c in cases)
    return [cpu_note(ran, len(cases))] if ran and not ctx.device.cuda else []


def _in_case_order(results: list[CaseResult], cases) -> list[CaseResult]:
    order = {c.id: i for i, c in enumerate(cases)}
    return sorted(results, key=lambda r: order.get(r.case, len(order)))


def _work_folder(sub: Submission) -> tempfile.TemporaryDirectory:
    """A submission's GPU stages' folder (its spec files, outputs and records), removed after."""
    return tempfile.TemporaryDirectory(prefix=f"grade-{sub.module_name}-", dir=_scratch())


def _scratch(need_bytes: int = 8 << 30) -> str | None:
    """Outputs are large (512 MiB on the largest case): keep them in memory where there is room
    (/dev/shm is often a small tmpfs in containers), else in the default temporary folder; inside
    a run, in the run's own scratch folder there, which nothing outlives (grader/runs.py)."""
    return scratch_dir(need_bytes)


def _save_log(ctx: GradeContext, name: str, stage: str, output: str) -> None:
    path = ctx.out_dir / "logs" / f"{name}.{stage}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(clean(output, limit=1 << 22))


def _save_calls(ctx: GradeContext, name: str, record: dict) -> None:
    """Each timed call's time as ranked (ms, in call order) and the subject's own events around
    it, for the instructor's logs and `make bench-grader` (how the median settles with the
    number of calls); no page shows them."""
    path = ctx.out_dir / "logs" / f"{name}.time.calls.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, dict(times_ms=record["times_ms"],
                                 events_ms=[c[1] for c in record.get("calls") or []]))


def _target(sub: Submission, build: BuildResult | None) -> dict:
    if sub.kind is Kind.CUDA:
        return dict(kind="cuda", artifact=build.artifact, module_name=sub.module_name)
    if sub.kind is Kind.PYTHON:
        return dict(kind="python", source=str(sub.source))
    return dict(kind="builtin", name=sub.id)


# ---------------------------------------------------------------- stages in child processes


HARNESS = [sys.executable, "-m", "grader.harness", "--spec"]


def harness_spec(mode: str, target: dict, ctx: GradeContext, work: Path, *, folder: list[Path],
                 deadline_s: float, jit: Path | None = None, **fields) -> tuple[dict, Path]:
    """What grader/harness.py (trusted: it never imports the submission) is to do in `mode`, and
    the file it is read from; the subject runs in the sandbox, read-only on `folder` and writable
    on its JIT cache `jit`."""
    cwd = folder[0] if folder else SUBJECT.parent
    spec = dict(mode=mode, device=ctx.device_name, target=target,
                subject_cmd=ctx.sandbox.wrap([sys.executable, str(SUBJECT)], readonly=folder,
                                             writable=[jit] if jit else [],
                                             # a student's code sees no cuDNN engine: a forged
                                             # report can claim no faster library (issue 30)
                                             hide_libraries=target.get("kind") in ("cuda", "python")),
                env=jit_env(ctx.env, jit) if jit else None,
                cwd=str(cwd), head_bytes=ctx.limits.output_head_bytes,
                tail_bytes=ctx.limits.output_tail_bytes,
                file_bytes=int(ctx.limits.file_gb * (1 << 30)), deadline_s=deadline_s,
                out_dir=str(work), result=str(work / f"{mode}.json"),
                jit=str(jit) if jit else None, **fields)
    return spec, work / f"{mode}_spec.json"


def harness_record(result: Path, harness_output: str) -> tuple[dict | None, str]:
    """The harness's record (None if the harness itself failed) and the text for the log."""
    if not result.exists():
        return None, harness_output
    record = json.loads(result.read_text())
    return record, record.get("output", "") + (f"\n[grader harness]\n{harness_output}"
                                               if harness_output.strip() else "")


def run_harness(mode: str, target: dict, ctx: GradeContext, work: Path, *, folder: list[Path],
                deadline_s: float, jit: Path | None = None, **fields) -> tuple[dict | None, str]:
    """Run grader/harness.py in `mode` (harness_spec) to its end: its record and log text."""
    spec, spec_path = harness_spec(mode, target, ctx, work, folder=folder, deadline_s=deadline_s,
                                   jit=jit, **fields)
    spec_path.write_text(json.dumps(spec))
    proc = run_limited([*HARNESS, str(spec_path)], timeout_s=deadline_s + 300, env=ctx.env,
                       cwd=config.REPO_ROOT, cpus=ctx.cpus.gpu,
                       **QUOTA.hooks(jit, spare_root=True))   # its subject writes there
    return harness_record(Path(spec["result"]), proc.output)


HARNESS_WAITING = [sys.executable, "-m", "grader.harness", "--wait"]


class WarmHarness:
    """A harness process started before its work is known (issue 13: its Python start and
    imports leave the GPU's critical path). It imports torch and the grader, touches no GPU and
    waits on its control pipe, on the builds' CPUs, off the GPU stages' (a timed call's harness
    and subject need theirs at once); begin() gives it a spec, and it does what a harness started
    with --spec would, on the GPU stages' CPUs (harness.take_cpus; a run begun early moves on its
    turn). The same pipes then carry run_then_time's "ran", "time" and "stop". Always closed:
    close() ends it (its subject with it) on every path."""

    def __init__(self, env: dict | None, cpus: CpuSplit | None):
        ready_r, ready_w = os.pipe()
        decide_r, decide_w = os.pipe()
        try:
            self.proc, self.reader = spawn_capped(
                [*HARNESS_WAITING, str(ready_w), str(decide_r)], env=env, cwd=config.REPO_ROOT,
                pass_fds=(ready_w, decide_r), cpus=cpus.build if cpus else None)
        except BaseException:
            os.close(ready_r)
            os.close(decide_w)
            raise
        finally:
            os.close(ready_w)
            os.close(decide_r)
        self.ready_r, self.decide_w = ready_r, decide_w
        self.key = _harness_key(env, cpus)
        self.closed = False
        self.jit: str | None = None   # its spec's JIT cache folder (grader/quota.py)
        self.left: set[int] = set()   # processes still running after close (end_processes)

    def begin(self, spec: dict, spec_path: Path, cpus: CpuSplit | None = None) -> None:
        """Its work: `spec` (harness_spec), written to `spec_path`, done on `cpus.gpu`. "spawned"
        is now: the run stage's "harness" part is how long a warm harness took to take it up."""
        where = dict(cpus=list(cpus.gpu)) if cpus else {}
        spec_path.write_text(json.dumps(dict(spec, spawned=time.monotonic(), **where)))
        self.jit = spec.get("jit")
        QUOTA.attach(self.jit, self.proc.pid, spare_root=True)   # its subject writes there
        self.say(f"spec {spec_path}\n".encode())

    def said(self, timeout_s: float) -> bytes:
        """What it wrote on its ready pipe within timeout_s (b"" if nothing, or it died)."""
        ready, _, _ = select.select([self.ready_r], [], [], timeout_s)
        return os.read(self.ready_r, 16) if ready else b""

    def prepared(self, timeout_s: float) -> bool:
        """Whether it says "prepared" (spec "prepare") within timeout_s; if not (it died, or
        is still preparing), it is closed at once."""
        ready = self.said(timeout_s).startswith(b"prepared")
        if not ready:
            self.close(wait_s=0)
        return ready

    def wait(self, timeout_s: float) -> None:
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass

    def close(self, wait_s: float = 30) -> None:
        """Let it go: "stop", up to wait_s for it to end its subject and exit, then its process
        group killed (at once with wait_s 0: one that is not reading its control pipe)."""
        if self.closed:
            return
        self.closed = True
        # its subject's processes too, and the orphans it adopted, before any ends
        tree = {pid: started_at(pid) for pid in process_tree(self.proc.pid)}
        self.say(b"stop\n")
        if wait_s:
            self.wait(wait_s)   # the harness ends its subject (Link.close) and exits
        # gone, each of them, before this returns (grader/gate.py's invariant); `left`: any not
        self.left = end_processes(self.proc, tree, timeout_s=60)
        QUOTA.detach(self.jit, self.proc.pid)
        self.reader.join(timeout=10)
        for fd in (self.ready_r, self.decide_w):
            os.close(fd)

    def say(self, word: bytes) -> None:
        try:
            os.write(self.decide_w, word)
        except OSError:   # the harness is gone: what it left says why
            pass


def _harness_key(env: dict | None, cpus: CpuSplit | None) -> tuple:
    return (tuple(sorted(env.items())) if env else None, cpus)


class _Spare:
    """A GPU worker's next harness, started when it took the last one (keep_warm). One per
    thread (_SPARE: PerThread, not threading.local: it holds a process)."""

    def __init__(self):
        self.keep = False
        self.harness: WarmHarness | None = None


def take_harness(env: dict | None, cpus: CpuSplit | None, *, spare: bool = True) -> WarmHarness:
    """A harness for the calling thread's next run stage. In a GPU worker (keep_warm), the one
    started when the worker took its last, its imports done while that one ran, if it has the
    same environment and CPUs and is alive; and another is started now for the next, unless not
    `spare` (a run begun early: the one after it is begun early too, Lookahead). Elsewhere (a
    single check, the tests) a new one, and none kept."""
    got, _SPARE.harness = _SPARE.harness, None
    if got is not None and (got.key != _harness_key(env, cpus) or got.proc.poll() is not None):
        got.close()
        got = None
    if got is None:
        got = WarmHarness(env, cpus)
    if _SPARE.keep and spare:
        _SPARE.harness = WarmHarness(env, cpus)
    return got


@contextlib.contextmanager
def keep_warm():
    """Inside, the calling thread (a GPU worker) keeps a spare harness started (take_harness);
    it is closed on the way out."""
    _SPARE.keep = True
    try:
        yield
    finally:
        _AHEAD.drop()
        _AHEAD.forget()
        spare = _SPARE.harness
        _SPARE.forget()   # keep off, and no spare held, from here
        if spare is not None:
            spare.close()


class Stages:
    """One harness process, and so one subject, for a submission's run and time stages
    (harness.run_then_time; issue 13: the time stage starts no second harness or subject and
    imports and compiles nothing again). The run stage begins it on a warm harness
    (take_harness); after the check the pipeline either times the largest case on that subject
    (time) or lets it go (close). Always closed: close() on every path, including after time()."""

    def __init__(self, spec: dict, spec_path: Path, *, env: dict, cpus: CpuSplit | None,
                 spare: bool = True):
        self.results = Path(spec["result"]), Path(spec["time"]["result"])
        self.time_s = spec["time"]["deadline_s"] + 300
        self.harness = take_harness(env, cpus, spare=spare)
        try:
            self.harness.begin(spec, spec_path, cpus)
        except BaseException:
            self.harness.close()
            raise

    def go(self) -> None:
        """A prepared run's turn (spec "prepare", Prepared.settle): load the submission, run."""
        self.harness.say(b"run\n")

    def ran(self, timeout_s: float) -> tuple[dict | None, str]:
        """The run stage's record and log text, once the harness says it has them (or has died,
        or timeout_s passed: then it is killed)."""
        said = self.harness.said(timeout_s)
        if not said.startswith(b"ran"):
            self.close()
        return harness_record(self.results[0], "" if said else self.harness.reader.text())

    def time(self) -> tuple[dict | None, str]:
        """The time stage on the run's subject, to its end: its record and log text."""
        self.harness.say(b"time\n")
        self.harness.wait(self.time_s)
        self.close()
        return harness_record(self.results[1], self.harness.reader.text())

    def close(self, wait_s: float = 30) -> None:
        self.harness.close(wait_s)


class TimeSubject:
    """A submission's time stage on a subject of its own (harness.time_prepared), for when run
    stages share the GPU (gate.py): begun with its run stage or before it (Lookahead), its harness
    and subject start CUDA and the profiler on the builds' CPUs and wait; on its turn, with the
    GPU held alone, the submission is loaded from its JIT cache and timed. Its run stage's
    subject, which ran beside other submissions' code, is gone by then. Always closed."""

    def __init__(self, spec: dict, spec_path: Path, *, env: dict, cpus: CpuSplit | None,
                 health_checks: int = 0):
        self.result = Path(spec["result"])
        self.time_s = spec["deadline_s"] + 300
        self.ready: bool | None = None
        self.health_checks = health_checks   # its GPU's count as it was begun (GpuGate)
        self.harness = WarmHarness(env, cpus)
        try:
            self.harness.begin(spec, spec_path, cpus)
        except BaseException:
            self.harness.close(wait_s=0)
            raise

    def settle(self, timeout_s: float = config.PREPARE_S) -> bool:
        """Wait until its harness says "prepared" (or has died, or timeout_s passed: then it is
        killed)."""
        if self.ready is None:
            self.ready = self.harness.prepared(timeout_s)
        return self.ready

    def time(self) -> tuple[dict | None, str]:
        """The time stage, to its end: its record (None when its subject never got to its turn)
        and the log text."""
        if self.settle():
            self.harness.say(b"run\n")
            self.harness.wait(self.time_s)
        self.close()
        return harness_record(self.result, self.harness.reader.text())

    def close(self) -> None:
        self.harness.close(wait_s=30 if self.ready else 0)


def time_subject(sub: Submission, build: BuildResult, ctx: GradeContext, timed: Case, work: Path,
                 jit: Path | None) -> TimeSubject:
    """`sub`'s TimeSubject, begun now: its record goes to work/time.json."""
    fields = _time_fields(timed, ctx, work)
    del fields["result"]   # harness_spec's: work/time.json
    spec, spec_path = harness_spec("time", _target(sub, build), ctx, work, folder=_folder(sub, build),
                                   jit=jit, prepare=True, **fields)
    return TimeSubject(spec, spec_path, env=ctx.env, cpus=ctx.cpus, health_checks=_health_checks(ctx))


def run_once(spec: dict, spec_path: Path, *, env: dict, cpus: CpuSplit | None
             ) -> tuple[dict | None, str]:
    """A harness's run of `spec` to its end, on a warm harness (take_harness): its record and
    log text; killed at the spec's deadline plus 300 s."""
    harness = take_harness(env, cpus)
    try:
        harness.begin(spec, spec_path, cpus)
        harness.wait(spec["deadline_s"] + 300)
    finally:
        harness.close()
    return harness_record(Path(spec["result"]), harness.reader.text())


class Ran(NamedTuple):
    """What a run stage gives: a record per case, {'status': 'pass' (ran; to be checked) |
    'runtime_error' | 'timeout', 'message', ...}; the log text; the Stages when its subject stays
    for the time stage (else None); and the seconds of each of results.RUN_PHASES that the
    harness measured ({} when it failed)."""
    runs: dict[str, dict]
    output: str
    stages: Stages | None
    phases_s: dict[str, float]


def run_cases(sub: Submission, build: BuildResult, cases: list[Case], ctx: GradeContext,
              work: Path, jit: Path | None = None, timed: Case | None = None,
              prepared: "Prepared | None" = None) -> Ran:
    """Each case once, driven by the harness. With `timed` (one of `cases`), the harness stays
    with its subject for the time stage: Ran.stages, to be timed or closed; `prepared`: that
    harness and subject, started before this submission's turn (Lookahead), told to go on now
    (NotStarted if its harness ends with no record). Meanwhile the worker's next submissions are
    begun (Lookahead.begin)."""
    stages = None
    if prepared is not None:
        stages = prepared.stages
        stages.go()
    elif timed is not None and timed in cases:
        spec, spec_path = stages_spec(sub, build, cases, ctx, work, jit, timed)
        stages = Stages(spec, spec_path, env=ctx.env, cpus=ctx.run_cpus)
    if stages is not None:
        try:
            _AHEAD.begin(ctx, timed)
        except BaseException:   # Cancelled: the run is stopping
            stages.close()
            raise
        record, output = stages.ran(ctx.limits.run_s + 300)
        if record is None and prepared is not None:   # its harness gave up (harness._give_up)
            stages.close()
            if stopping():   # killed by the run's stop: not graded, and not started anew
                raise Cancelled("the run is stopping: a run begun early was stopped")
            raise NotStarted(output)
    else:
        spec, spec_path = harness_spec("run", _target(sub, build), ctx, work,
                                       folder=_folder(sub, build), deadline_s=ctx.limits.run_s,
                                       jit=jit, **_run_fields(cases, ctx))
        record, output = run_once(spec, spec_path, env=ctx.env, cpus=ctx.cpus)
    if record is None:
        message = f"grader error: the harness failed; tell the instructor\n{output[-3000:]}"
        return Ran({c.id: dict(status="runtime_error", message=message) for c in cases}, output,
                   stages, {})
    return Ran(record["cases"], output, stages, record.get("phases_s") or {})


def _run_fields(cases: list[Case], ctx: GradeContext) -> dict:
    """What the harness's run stage needs beyond the spec's common fields."""
    return dict(cases=[c.to_dict() for c in cases],
                case_limits={c.id: ctx.limits.case_s(c.flops) for c in cases} if ctx.device.cuda else {})


def stages_spec(sub: Submission, build: BuildResult, cases: list[Case], ctx: GradeContext,
                work: Path, jit: Path | None, timed: Case, **fields) -> tuple[dict, Path]:
    """The spec of a run stage that stays for the time stage (harness.run_then_time)."""
    return harness_spec("run_then_time", _target(sub, build), ctx, work, folder=_folder(sub, build),
                        deadline_s=ctx.limits.run_s, jit=jit, time=_time_fields(timed, ctx, work),
                        **_run_fields(cases, ctx), **fields)


# ---------------------------------------------------------------- the next submission, begun early


@dataclasses.dataclass
class Prepared:
    """A submission's run stage begun before its turn: its work and JIT folders (`folders` owns
    them), and Stages whose harness has its spec ("prepare"), its buffers and a subject that has
    started CUDA and its profiler and waits to load the submission (harness.start_prepared)."""
    sub: Submission
    work: Path
    jit: Path | None
    stages: "Stages"
    folders: contextlib.ExitStack
    ready: bool | None = None   # None until settled: prepared, or not (then closed)
    timer: TimeSubject | None = None   # its time stage's subject, when run stages share the GPU
    health_checks: int = 0   # its GPU's gate's count when it was begun (GpuGate.health_check)

    def settle(self, timeout_s: float = config.PREPARE_S) -> bool:
        """Wait until its harness says "prepared" (or has died, or timeout_s passed: then it is
        closed). Its GPU work (CUDA's start, the profiler's) is over once this returns."""
        if self.ready is None:
            self.ready = self.stages.harness.prepared(timeout_s)
        return self.ready

    def close(self) -> None:
        """Its processes and folders gone; one still preparing (not reading its control pipe) is
        killed at once."""
        self.stages.close(wait_s=30 if self.ready else 0)
        if self.timer is not None:
            self.timer.close()
        self.folders.close()


def prepare(sub: Submission, build: BuildResult, ctx: GradeContext, timed: Case) -> Prepared | None:
    """`sub`'s run stage begun now, its subject prepared but loading nothing (Prepared); None
    when it would not run to a time stage (failed build, not every case runnable here)."""
    runnable, _, _ = _select_cases(sub, ctx)
    if build.status is not Status.PASS or sub.kind not in (Kind.PYTHON, Kind.CUDA) or timed not in runnable:
        return None
    checks = _health_checks(ctx)   # as it was before any of it began
    folders = contextlib.ExitStack()
    try:
        jit = folders.enter_context(jit_cache(sub, ctx.limits))
        work = Path(folders.enter_context(_work_folder(sub)))
        spec, spec_path = stages_spec(sub, build, runnable, ctx, work, jit, timed, prepare=True)
        stages = Stages(spec, spec_path, env=ctx.env, cpus=ctx.run_cpus, spare=False)
        folders.callback(stages.close, wait_s=0)   # (a no-op once closed)
        timer = time_subject(sub, build, ctx, timed, work, jit) if ctx.gate is not None else None
    except BaseException:
        folders.close()
        raise
    return Prepared(sub, work, jit, stages, folders, timer=timer, health_checks=checks)


def _current(timer: "TimeSubject | None", ctx: GradeContext) -> "TimeSubject | None":
    """`timer`, unless a health check of its GPU began after it was begun (another lane's crash,
    beside which it started CUDA): then it is closed, and None (timed on a new subject)."""
    if timer is not None and timer.health_checks != _health_checks(ctx):
        timer.close()
        return None
    return timer


def _health_checks(ctx: GradeContext) -> int:
    """Its GPU's count of health checks (GpuGate.health_check); 0 where no lanes share the GPU."""
    return ctx.gate.health_checks if ctx.gate is not None else 0


class Lookahead:
    """A GPU worker's next submissions, begun while the one before runs (issue 13). The worker
    says which come next (queue); when a run stage starts, up to config.LOOKAHEAD of them are
    being prepared (begin): a harness and a subject each, with torch's import, CUDA's start, the
    shared buffers and the profiler's first start (10-15 s on an H100), on the builds' CPUs, off
    the GPU's critical path. Only the grader's code and torch run in them until their turn: a
    submission is loaded when its run stage says "run", and its processes move to the GPU
    stages' CPUs then. They may start CUDA while another submission's call is timed: that moved
    no timed call (bench/prepare_overlap_probe.json: medians within 0.3%). A turn claims its run
    (grade_submission), waiting for its preparation to end; what is not claimed is closed with
    the worker. One per GPU worker (_AHEAD: PerThread)."""

    def __init__(self):
        self.queued: list[tuple[Submission, BuildResult]] = []   # to begin, in order
        self.prepared: list[Prepared] = []                       # begun, in order

    def queue(self, jobs: list) -> None:
        """The worker's next jobs, in order: the submissions' whose build passed may be begun."""
        begun = {id(p.sub) for p in self.prepared}
        self.queued = [(sub, build) for what, _, sub, build in jobs
                       if what == "submission" and build.status is Status.PASS
                       and id(sub) not in begun]

    def begin(self, ctx: GradeContext, timed: Case | None) -> None:
        while timed is not None and self.queued and len(self.prepared) < ctx.lookahead:
            sub, build = self.queued.pop(0)
            try:
                prepared = prepare(sub, build, ctx, timed)
            except Cancelled:
                raise
            except Exception as e:   # never the running submission's problem: it runs as usual
                ctx.progress.note(f"{sub.id}: could not begin its run early ({e!r})")
                continue
            if prepared is not None:
                self.prepared.append(prepared)

    def settle(self) -> None:
        for prepared in self.prepared:
            prepared.settle()

    def begun(self, sub: Submission) -> bool:
        """Whether this worker began a run of `sub` early (its turn then waits for it: claim)."""
        return any(p.sub is sub for p in self.prepared)

    def claim(self, sub: Submission, gate: GpuGate | None = None) -> Prepared | None:
        """The prepared run of `sub`, once its preparation has ended, if this worker began one
        and it got ready, and no health check of its GPU began since it was begun (`gate`, where
        lanes share the GPU: another lane's crash); else None. Runs begun for submissions queued
        before it are closed (their turn is past); those after it stay."""
        for i, got in enumerate(self.prepared):
            if got.sub is sub:
                skipped, self.prepared = self.prepared[:i], self.prepared[i + 1:]
                for other in skipped:
                    other.close()
                fresh = gate is None or gate.health_checks == got.health_checks
                if fresh and got.settle() and got.stages.harness.proc.poll() is None:
                    return got
                got.close()
                return None
        return None

    def drop(self) -> None:
        self.queued = []
        begun, self.prepared = self.prepared, []
        for got in begun:
            got.close()


class PerThread:
    """One object per thread, made on first use, held in a plain dict keyed by the thread rather
    than in threading.local, for whatever holds processes or folders (_AHEAD, _SPARE).
    procs.spawn_capped starts every child with a preexec_fn, so Python runs in the child after
    fork, and there the other threads' thread-local data is freed: what
    only it holds is deallocated and its finalizers run, in the child but on the shared disk. A
    GPU worker's runs begun early, held in a threading.local, lost their folders that way
    (TemporaryDirectory's finalizer removed them) whenever a build thread started a process:
    6 of 9 in session 14's course, each then a grader error. Attributes are the calling thread's
    object's, to read and to set; forget() lets the calling thread's go (at the worker's end)."""

    def __init__(self, make):
        self._make, self._objects, self._lock = make, {}, threading.Lock()

    def mine(self):
        with self._lock:
            key = threading.get_ident()
            if key not in self._objects:
                self._objects[key] = self._make()
            return self._objects[key]

    def forget(self) -> None:
        with self._lock:
            self._objects.pop(threading.get_ident(), None)

    def __getattr__(self, name: str):
        return getattr(self.mine(), name)

    def __setattr__(self, name: str, value) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self.mine(), name, value)


_AHEAD = PerThread(Lookahead)
_SPARE = PerThread(_Spare)


@dataclasses.dataclass(frozen=True)
class TimedRun:
    stats: TimingStats
    record: dict      # what the harness saw: verification, spot checks, GPU processes


def _time_fields(case: Case, ctx: GradeContext, work: Path) -> dict:
    """What the harness's time stage needs beyond the spec's common fields."""
    return dict(case=case.to_dict(), budget_s=ctx.limits.time_budget_s, l2_bytes=ctx.device.l2_bytes,
                coarse_ms=coarse_ms(case, ctx.device), protocol=ctx.protocol.to_dict(),
                precision=dict(precision_factor=ctx.precision[0], precision_floor=ctx.precision[1]),
                deadline_s=ctx.limits.time_s, result=str(work / "time.json"))


def time_target(target: dict, case: Case, ctx: GradeContext, *, folder: list[Path],
                log_name: str | None = None, jit: Path | None = None,
                stages: Stages | None = None,
                timer: "TimeSubject | None" = None) -> TimedRun | tuple[Status, str]:
    """Timing statistics of one case, measured by the harness (on the run stage's subject when
    `stages` are given, on `timer`'s prepared one, else on a new one); or (status, message) if
    the subject failed while being timed."""
    record = None
    if stages is not None:
        record, output = stages.time()
    elif timer is not None:
        record, output = timer.time()
        if record is None:   # it gave up before loading anything (harness.time_prepared)
            if stopping():
                raise Cancelled("the run is stopping: a prepared time stage was stopped")
            ctx.progress.note(f"{log_name or target}: its time stage's prepared subject did not "
                              f"start; timing on a new one" + _harness_said(output))
    if record is None and stages is None:
        with tempfile.TemporaryDirectory(prefix="time-", dir=_scratch()) as tmp:
            fields = _time_fields(case, ctx, Path(tmp))
            del fields["result"]
            record, output = run_harness("time", target, ctx, Path(tmp), folder=folder, jit=jit,
                                         **fields)
    if log_name:
        _save_log(ctx, log_name, "time", output)
        if record is not None and isinstance(record.get("times_ms"), list):
            _save_calls(ctx, log_name, record)
    if record is None:
        ensure_gpu_healthy(ctx)
        return Status.RUNTIME_ERROR, f"grader error: the timing harness failed; tell the instructor\n{output[-2000:]}"
    if "failed" in record:
        ensure_gpu_healthy(ctx)
        failed = record["failed"]
        return Status(failed["status"]), failed["message"]
    return TimedRun(TimingStats.from_dict(record["stats"]), record)


def coarse_ms(case: Case, device: DeviceInfo) -> float | None:
    """The median above which a call is timed coarsely (config.TIMING_COARSE_FRACTION of the
    GPU's measured matmul peak); None where the peak is unknown."""
    if not device.matmul_tflops:
        return None
    return case.flops / (device.matmul_tflops * 1e12 * config.TIMING_COARSE_FRACTION) * 1e3


PROTOCOL_FILE = "_protocol.json"   # the run's ProtocolCost, for the rows a resumed run keeps


def calibrate_protocol(ctx: GradeContext, *, reuse: bool = False) -> ProtocolCost:
    """The protocol's own cost per timed call on the largest case, measured once per run by the
    harness on subjects that run no submission (grader/harness.py calibrate); zero without a GPU
    or if it failed (then times include it, for every row alike). With `reuse` (a resumed run
    that keeps results timed earlier), the cost those were corrected with is used again if it was
    measured on this GPU for this case: every row of one run has the same cost subtracted."""
    if not ctx.device.cuda:
        return ProtocolCost()
    # One file per GPU: the first GPU's where it always was, another's beside it.
    saved = ctx.out_dir / (f"_protocol.{ctx.gpu_tag}.json" if ctx.gpu_tag else PROTOCOL_FILE)
    where = dict(device=ctx.device.name, uuid=ctx.device.uuid or None,
                 case=largest(list(ctx.cases)).id)
    if reuse:
        try:
            earlier = json.loads(saved.read_text())
            was, now = dict(earlier.get("where") or {}), dict(where)
            if None in (was.get("uuid"), now["uuid"]):   # written before GPUs had UUIDs here
                was["uuid"] = now["uuid"] = None
            if was == now:
                cost = ProtocolCost.from_dict(earlier.get("cost"))
                ctx.progress.note(f"protocol cost of the results kept from the earlier run "
                                  f"reused: {cost.idle_ms:.3f} / {cost.busy_ms:.3f} ms")
                return cost
        except (OSError, ValueError, TypeError, AttributeError):
            pass
    cost = _measure_protocol(ctx)
    write_json_atomic(saved, dict(where=where, cost=cost.to_dict()))
    return cost


def _measure_protocol(ctx: GradeContext) -> ProtocolCost:
    _AHEAD.settle()
    with tempfile.TemporaryDirectory(prefix="calibrate-", dir=_scratch()) as tmp:
        record, output = run_harness("calibrate", dict(kind="builtin", name="null"), ctx, Path(tmp),
                                     folder=[], deadline_s=ctx.limits.time_s,
                                     case=largest(list(ctx.cases)).to_dict(),
                                     l2_bytes=ctx.device.l2_bytes)
    if record is None or "protocol" not in record:
        ctx.progress.note(f"protocol calibration failed; times include the protocol's cost\n{output[-1500:]}")
        return ProtocolCost()
    cost = ProtocolCost.from_dict(record["protocol"])
    ctx.progress.note(f"protocol calibrated: {cost.idle_ms:.3f} ms per call without GPU work, "
                      f"{cost.busy_ms:.3f} ms around {cost.busy_work_ms:.1f} ms of attention kernels "
                      f"(round trip {record['rtt_ms']:.3f} ms, GPU context switches, output copy), "
                      f"subtracted from every timed call; {ctx.cpus.describe()}")
    return cost


def ensure_gpu_healthy(ctx: GradeContext, *, tries: int = 2) -> None:
    """After a crash or a kill, make sure the next submission gets a working GPU. A run begun
    early beside the crash or the hung kernel is let go, this worker's at once and, where lanes
    share the GPU, every other lane's on its turn (GpuGate.health_check): it runs afresh."""
    _AHEAD.drop()
    if not ctx.device.cuda:
        return
    if ctx.gate is not None:
        ctx.gate.health_check()
    probe_gpu(ctx, tries)
    if ctx.gate is not None:
        ctx.gate.health_check()   # what began during the check too


def probe_gpu(ctx: GradeContext, tries: int) -> None:
    """A small computation on the GPU in a process of its own, up to `tries` times; GpuUnhealthy
    when none works."""
    probe = ("import torch; x = torch.ones(1 << 20, device='cuda'); "
             "assert float(x.sum()) == float(1 << 20); torch.cuda.synchronize()")
    for attempt in range(tries):
        proc = run_limited([sys.executable, "-c", probe], timeout_s=120, env=ctx.env,
                           cpus=ctx.cpus.gpu)
        if proc.ok:
            return
        time.sleep(5 * (attempt + 1))
    raise GpuUnhealthy(f"the GPU failed its health check after a submission:\n{proc.tail(15)}")


# ---------------------------------------------------------------- baselines


def grade_baseline(name: str, ctx: GradeContext) -> SubmissionResult:
    """A PyTorch baseline row: its code runs in a subject like a submission's, timed by the same
    harness on the largest case."""
    started = time.monotonic()
    baseline = BASELINES[name]
    base = dict(id=name, label=baseline.label, kind="builtin", role="baseline")
    if not ctx.device.cuda:
        return SubmissionResult(**base, status=Status.NOT_RUN, message="not run: no CUDA device",
                                graded_at=now())
    case = largest(list(ctx.cases))
    timed = time_target(dict(kind="builtin", name=name), case, ctx, folder=[])
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


def worker_contexts(ctx: GradeContext) -> list[GradeContext]:
    """One context per GPU worker: its own device (name, UUID, architecture, L2), slot (its CPUs,
    procs.split_cpus), environment (its children's CUDA sees only its GPU) and sandbox (only its
    GPU's device node: a submission cannot open another's). One GPU, or none: one worker."""
    devices = ctx.gpus if len(ctx.gpus) > 1 else (ctx.device,)
    workers = []
    for slot, device in enumerate(devices):
        minor = device_minor(device.uuid) if device.cuda and device.uuid else None
        if device.cuda and minor is None and len(devices) > 1:
            ctx.progress.note(f"{device.label}: its device node (/dev/nvidiaN) was not found; "
                              f"its submissions' processes can open every GPU's node")
        lanes = ctx.lanes if device.cuda else 1
        workers.append(dataclasses.replace(ctx, device=device, slot=slot, lanes=lanes,
                                           gate=GpuGate() if lanes > 1 else None,
                                           sandbox=ctx.sandbox.for_gpu(minor),
                                           progress=ctx.progress if len(devices) == 1
                                           else ctx.progress.on(device.label)))
    return workers


class _Jobs:
    """What the GPU workers take, in order: jobs pinned to a worker (a baseline timed on its GPU)
    first, then the shared queue (students' finished builds: a faster GPU takes more). `pending`
    counts the builds not finished yet; a worker with nothing to take waits for them, and stops
    when there are none left, or when the run stops."""

    def __init__(self, workers: int):
        self.cond = threading.Condition()
        self.pinned = [deque() for _ in range(workers)]
        self.shared: deque = deque()
        self.pending = 0
        self.stopped = False
        self.idle = 0   # workers waiting for a job

    def put(self, jobs: list, *, built: bool = False) -> None:
        """Queue (slot or None, job) pairs; `built`: a pending build's jobs (or none, if it went)."""
        with self.cond:
            for slot, job in jobs:
                (self.shared if slot is None else self.pinned[slot]).append(job)
            self.pending -= 1 if built else 0
            self.cond.notify_all()

    def take(self, slot: int, *, wait: bool = True):
        """The next job for worker `slot`; None when there is none. Without `wait` (a worker
        taking its next job early, Lookahead): one now, and a shared one only if a job is left
        for every worker waiting for one: a GPU never idles while another holds a job."""
        with self.cond:
            while True:
                if self.stopped:
                    return None
                if self.pinned[slot]:
                    return self.pinned[slot].popleft()
                if self.shared and (wait or len(self.shared) > self.idle):
                    return self.shared.popleft()
                if self.pending <= 0 or not wait:
                    return None
                self.idle += 1
                try:
                    self.cond.wait()
                finally:
                    self.idle -= 1

    def waiting(self) -> int:
        """Jobs queued and not taken yet."""
        with self.cond:
            return len(self.shared) + sum(len(q) for q in self.pinned)

    def stop(self) -> list:
        """No worker takes anything more; returns what was still queued."""
        with self.cond:
            self.stopped = True
            left = [job for q in (*self.pinned, self.shared) for job in q]
            for q in (*self.pinned, self.shared):
                q.clear()
            self.cond.notify_all()
            return left


def build_throttle(build_jobs: int, ctx: GradeContext, waiting) -> BuildThrottle:
    """How many of the `build_jobs` builds compile at once (gate.BuildThrottle): a share of them
    (Limits.build_yield_share) while the GPU workers have config.BUILDS_YIELD_AHEAD jobs waiting,
    on a GPU machine; all of them without a GPU (nothing there is timed)."""
    share = ctx.limits.build_yield_share if ctx.device.cuda else 1.0
    low = max(1, int(build_jobs * share))
    return BuildThrottle(build_jobs, low, config.BUILDS_YIELD_AHEAD, waiting)


def grading_context(*, cases, device: DeviceInfo, gpus: list[DeviceInfo], limits: config.Limits,
                    out_dir: Path, build_dir: Path, progress: Progress, sandbox: Sandbox,
                    calibration: bool, policy, build_cache: BuildCache | None,
                    lanes: int = 1, student_check: bool = False) -> GradeContext:
    """A grading run's context (`grade`, `check`, one Slurm task): one GPU worker per GPU of
    `gpus` when there are several, each with `lanes` (worker_contexts); `student_check` for
    `check` (GradeContext.student_check)."""
    return GradeContext(cases=tuple(cases), device=device, limits=limits, out_dir=out_dir, lanes=lanes,
                        build_dir=build_dir, progress=progress, sandbox=sandbox,
                        calibration=calibration,
                        precision=(policy.precision_factor, policy.precision_floor),
                        build_cache=build_cache, gpus=tuple(gpus) if len(gpus) > 1 else (),
                        student_check=student_check)


def student_check(ctx: GradeContext, sub: Submission) -> StudentCheck | None:
    """What a build of `check` reports to (build.StudentCheck): the run's display, as the build
    stage's line (in place, every second, in a terminal; a line every config.BUILD_PROGRESS_S
    seconds otherwise). None in a course's `grade`: its display shows every submission at once."""
    if not ctx.student_check:
        return None
    every = 1.0 if ctx.progress.in_place else config.BUILD_PROGRESS_S
    return StudentCheck(report=lambda line: ctx.progress.stage(sub.id, f"build: {line}"),
                        every_s=every)


def gpu_records(gpus: list[DeviceInfo]) -> list[dict]:
    """The run file's record of the GPUs a run grades on."""
    return [dict(index=d.index, name=d.name, uuid=d.uuid, matmul_tflops=d.matmul_tflops)
            for d in gpus]


def grade_all(subs: list[Submission], ctx: GradeContext, *, baselines: list[str],
              build_jobs: int | None = None, force: bool = False, only: set[str] | None = None,
              journal: "RunJournal | None" = None) -> list[SubmissionResult]:
    """Builds run `build_jobs` at a time (default: as many as the build CPUs and memory allow,
    procs.default_build_jobs); the GPU stages run on one GPU worker per GPU of
    `ctx.gpus` (one worker when it has at most one), each one submission at a time, taking the
    builds in the order they finish, on CPUs the builds do not use (GradeContext.cpus). Each
    worker calibrates the protocol on its GPU and times the PyTorch baselines there while the
    first builds compile; the reference solution is graded on every GPU too. Baselines on the
    first GPU keep their result files; on another, under baselines/gpu<index>/.

    A submission or baseline whose result on disk has this run's key (grader/runs.py) is
    skipped, unless `force`; with `only`, those ids are graded and the others keep what they
    have. `journal` (the run file) learns the roster and every result as it lands. Ctrl-C
    (KeyboardInterrupt) or a GPU failure cancels the queued builds and kills every running
    child of every worker before it propagates; what was finished is on disk. Returns the
    results graded."""
    workers = worker_contexts(ctx)
    slot_of = {w.gpu_tag: k for k, w in enumerate(workers)}
    results: list[SubmissionResult] = []
    entries = plan_run(subs, baselines, ctx, force=force, only=only,
                       gpu_copies=tuple(w.gpu_tag for w in workers[1:]))
    _pin_baselines(entries, workers, slot_of)
    by_sub: dict[int, list] = {}
    for e in entries:
        if e.sub is not None:
            by_sub.setdefault(id(e.sub), []).append(e)
    if journal is not None:
        journal.plan(entries)
    if len(entries) != getattr(ctx.progress, "total", len(entries)):
        ctx.progress.set_total(len(entries))   # each baseline once per GPU
    _announce(entries, ctx.progress, only=only)
    lock = threading.Lock()
    halted = threading.Event()   # the run stops: no result is written from here

    def record(result: SubmissionResult, entry, worker: GradeContext | None, *,
               stopped: bool = False) -> None:
        """Write a result; `worker`: the one whose GPU graded it. Nothing is written once the
        run stops (its children were killed: what they left is no verdict), unless `stopped`
        (a verdict that needed no child: a failed build)."""
        result = dataclasses.replace(result, key=entry.key,
                                     gpu=worker.gpu_ref if worker is not None else None)
        with lock:
            if halted.is_set() and not stopped:
                return
            write_result(ctx.out_dir, result, path=entry.path)
            results.append(result)
            (worker or ctx).progress.done(result)
            if journal is not None:
                journal.record("graded")

    def build(sub: Submission) -> BuildResult:
        ctx.progress.stage(sub.id, "build")
        if not ctx.calibration:   # decided from the source alone: nothing of it is built or run
            flagged = source_verdict(sub, sources[id(sub)])
            if flagged:
                return BuildResult(Status.FLAGGED, "none", 0.0, message=flagged)
        build_dir = ctx.build_dir / sub.build_namespace / sub.module_name
        with throttle.turn():
            built = build_submission(sub, build_dir=build_dir, device=ctx.device,
                                     limits=ctx.limits, sandbox=ctx.sandbox, cache=ctx.build_cache,
                                     log_path=ctx.out_dir / "logs" / f"{sub.id}.build.log",
                                     student_check=student_check(ctx, sub))
        return built if ctx.calibration else audit_build(sub, built, build_dir, sources[id(sub)])

    for entry in entries:
        if entry.action != "grade":
            ctx.progress.skipped(entry.existing, entry.id, kept=entry.action == "keep")
            if journal is not None:
                journal.record("skipped" if entry.action == "skip" else "kept")
    graded = [e for e in entries if e.action == "grade"]
    to_build = build_order(list({id(e.sub): e.sub for e in graded if e.sub is not None}.values()))
    # Each folder's sources, read before any of its code runs (own kernel names).
    sources = {id(s): read_sources(s.path) if s.kind is not Kind.INVALID else "" for s in to_build}
    jobs = _Jobs(len(workers))
    jobs.pending = len(to_build)
    jobs.put([(slot_of[e.gpu], ("baseline", e, None, None)) for e in graded if e.sub is None])

    def built(sub: Submission, future: concurrent.futures.Future) -> None:
        """A build finished: its jobs go to the workers (a student's to any, the solution's
        each to its own GPU)."""
        queued = []
        try:
            if jobs.stopped or future.cancelled():
                return
            try:
                build_result = future.result()
            except Exception as e:   # a grader bug must not stop the other submissions
                build_result = BuildResult(Status.BUILD_ERROR, "none", 0.0,
                                           message=f"grader error while building: {e!r}")
            queued = [(slot_of[e.gpu] if e.role == "baseline" else None,
                       ("submission", e, sub, build_result))
                      for e in by_sub[id(sub)] if e.action == "grade"]
        finally:
            jobs.put(queued, built=True)

    reused = len(graded) < len(entries)   # some results of this run are kept: their cost
    errors: list[BaseException] = []

    def work(slot: int, worker: GradeContext) -> None:
        """GPU `slot`'s worker: the protocol calibrated on it, then its lanes (worker.lanes
        threads, this one among them) taking jobs, their run stages sharing the GPU and their
        time stages one at a time (gate.py); one lane grades as before lanes."""
        try:
            with gpu_worker(slot):
                if graded:   # while the first builds compile
                    worker = dataclasses.replace(worker, protocol=calibrate_protocol(worker, reuse=reused))
            lanes = [threading.Thread(target=lane, args=(slot, worker), daemon=True,
                                      name=f"gpu-worker-{slot}.{k}") for k in range(1, worker.lanes)]
            for t in lanes:
                t.start()
            lane(slot, worker)
            for t in lanes:
                t.join()
        except BaseException as e:   # Cancelled (stopping), a grader bug
            errors.append(e)
            jobs.stop()

    def lane(slot: int, worker: GradeContext) -> None:
        with gpu_worker(slot), keep_warm():
            try:
                job, ahead = jobs.take(slot), deque()
                while job is not None:
                    while len(ahead) < worker.lookahead:   # begun while this one runs
                        upcoming = jobs.take(slot, wait=False)
                        if upcoming is None:
                            break
                        ahead.append(upcoming)
                    _AHEAD.queue(list(ahead))
                    grade_job(job, worker)
                    job = ahead.popleft() if ahead and not jobs.stopped else jobs.take(slot)
            except BaseException as e:   # GpuUnhealthy, Cancelled (stopping), a grader bug
                errors.append(e)
                jobs.stop()

    def grade_job(job, worker: GradeContext) -> None:
        what, entry, sub, build_result = job
        if what == "baseline":
            with alone(worker.gate):
                worker.progress.stage(entry.id, "time")
                result = grade_baseline(entry.id, worker)
            record(result, entry, worker)
            return
        started = time.monotonic()
        try:
            result = grade_submission(sub, build_result, worker, sources[id(sub)])
        except (GpuUnhealthy, Cancelled):
            raise
        except Exception as e:   # a grader bug: this submission's result says so, then go on
            worker.progress.note(f"{sub.id}: grader error\n{traceback.format_exc(limit=12)}")
            status, message = Status.RUNTIME_ERROR, f"grader error: {e!r}; tell the instructor"
            if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
                # the machine's scratch space, which another submission may have filled: never
                # this one's verdict; not scored, and graded again by the next run
                status, message = Status.ENVIRONMENT_ERROR, (
                    f"the grading machine ran out of scratch space while grading this submission "
                    f"({e!r}): the machine's fault, not your submission's; it will be graded again")
            result = SubmissionResult(id=sub.id, label=_label(sub), kind=sub.kind.value,
                                      role=sub.role.value, status=status, message=message,
                                      build=build_result, graded_at=now(),
                                      wall_s=round(time.monotonic() - started, 2))
        record(result, entry, worker if build_result.status is Status.PASS else None)

    if build_jobs is None:
        build_jobs = default_build_jobs(ctx.cpus)
    throttle = build_throttle(build_jobs, ctx, jobs.waiting)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, build_jobs))
    threads = [threading.Thread(target=work, args=(slot, w), name=f"gpu-worker-{slot}", daemon=True)
               for slot, w in enumerate(workers)]
    set_gpu_workers(len(workers))
    try:
        for s in to_build:
            pool.submit(build, s).add_done_callback(lambda f, s=s: built(s, f))
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(timeout=0.25)   # short waits: a Ctrl-C lands here at once
        if errors:
            raise errors[0]
    except BaseException:
        # Stop now: nothing queued starts, every child process group dies, then the threads
        # (whose children just died) return at once. Unfinished work has no result on disk;
        # a build that had already failed is a finished verdict, and is written.
        halted.set()
        left = jobs.stop()
        cancel_all()
        pool.shutdown(wait=True, cancel_futures=True)
        for t in threads:
            if t.ident is not None:   # started
                t.join(timeout=60)
        for what, entry, sub, build_result in left:
            if what == "submission" and build_result.status is not Status.PASS:
                try:
                    record(grade_submission(sub, build_result, ctx, sources[id(sub)]), entry,
                           None, stopped=True)
                except Exception:   # stopping: what cannot be written now is graded next time
                    pass
        raise
    finally:
        set_gpu_workers(1)
    pool.shutdown(wait=True)
    return results


# How long a kind's build takes, in the order builds start: a folder that is neither kind is a
# verdict at once; a Python one is an import check (seconds); a CUDA one compiles (30-120 s).
BUILD_ORDER = (Kind.INVALID, Kind.PYTHON, Kind.CUDA)


def build_order(subs: list[Submission]) -> list[Submission]:
    """The order builds start in: the quick ones first (BUILD_ORDER), each kind in the order
    given. The GPU stages take builds as they finish, so the GPU starts on the first Python
    submission within seconds and grades the quick ones while the CUDA ones compile. In the
    order given, a course whose CUDA ids sort first leaves the GPU idle until the first CUDA
    build ends: session 11's cold 100-copy course (fail_* and solution_* before triton_flash_*,
    13 builds at a time) gave the GPU nothing for its first 100 s or so."""
    return sorted(subs, key=lambda s: BUILD_ORDER.index(s.kind))


def _pin_baselines(entries, workers: list[GradeContext], slot_of: dict[str, int]) -> None:
    """A baseline kept from an earlier run is timed again when it was timed on another GPU than
    the one it stands for now: each GPU's rows are compared with its own baselines."""
    for e in entries:
        if e.role != "baseline" or e.action != "skip" or e.existing is None:
            continue
        had, want = e.existing.gpu, workers[slot_of[e.gpu]].device.uuid
        if had is not None and had.uuid and want and had.uuid != want:
            e.action, e.why = "grade", f"it was timed on another GPU ({had.label}, {had.uuid})"


def _announce(entries, progress: Progress, *, only: set[str] | None) -> None:
    """Say what the run will do: how many are unchanged (skipped), kept (--only), regraded and why."""
    skip = sum(e.action == "skip" for e in entries)
    keep = [e for e in entries if e.action == "keep"]
    if skip:
        progress.note(f"{skip} of {len(entries)} unchanged since they were graded (same source, "
                      f"cases, grader, policy, device and limits): skipped; --force regrades them")
    if only is not None:
        none = sum(e.existing is None for e in keep)
        progress.note(f"--only: grading {len(entries) - len(keep)} of {len(entries)}; the other "
                      f"{len(keep)} keep their results" + (f" ({none} have none: shown as missing)"
                                                            if none else ""))
    reasons: dict[str, list[str]] = {}
    for e in entries:
        if e.action == "grade" and e.why and e.label not in reasons.get(e.why, ()):
            reasons.setdefault(e.why, []).append(e.label)   # a baseline once, not once per GPU
    for why, labels in reasons.items():
        shown = ", ".join(labels[:5]) + (f" and {len(labels) - 5} more" if len(labels) > 5 else "")
        progress.note(f"regrading {shown}: {why}")

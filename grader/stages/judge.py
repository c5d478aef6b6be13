"""Judge: the verdict from what the stages found. What the sources and the build's audit show
(source_verdict, audit_build, audit_review), the kernels the calls launched (launch_findings),
what the timed calls show (judge_timing), and the SubmissionResult itself (finish)."""

from __future__ import annotations

import dataclasses
import subprocess
import time
from pathlib import Path
from grader.trusted.audit import allowlist
from grader.trusted import identity
from grader.trusted.audit import reach
from grader.build.messages import NOT_YOURS
from grader.trusted.audit.reach import STUDENT_OBJECT
from grader.course.verdicts import BuildResult
from grader.problem import Case
from grader.course.verdicts import CaseResult
from grader.report.hints import hint_for
from grader.trusted.integrity import (TimingFinding, classify_launched, static_evidence, tampering_lines,
                        timing_findings)
from grader.isolation.quota import QUOTA
from grader.course.results import SubmissionResult
from grader.common.status import Status, worst
from grader.course.submission import Kind, Role, Submission
from grader.common.text import clean
from grader.course.verdicts import TimingStats
from grader.stages.context import GradeContext, now
from grader.stages.time import TimedRun
from grader.stages.check import in_case_order
from grader.stages.clock import StageClock
from grader.stages.folders import label_of, read_source_text
from grader.stages.run import CasePlan, ran_where


def over_quota(result: SubmissionResult, jit: Path | None) -> SubmissionResult:
    """`result`, unless its JIT cache went over its limits (grader/isolation/quota.py): then that is the
    verdict, whatever its stages made of their killed processes, and it is not timed."""
    watch = QUOTA.over(jit)
    if watch is None:
        return result
    return dataclasses.replace(result, status=Status.RUNTIME_ERROR,
                               message=watch.message("its JIT cache folder"), timing=None,
                               timed_case=None)


def kernels_of(cases: list[CaseResult], timing: TimingStats | None, source: str, sub: Submission,
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
    (grader/trusted/audit/allowlist.py). A CUDA build's includes are the compiler's, checked with its object
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
    """A CUDA build that passed, audited before any of its code runs (grader/trusted/audit/reach.py): the
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


def finish(base: dict, status: Status, message: str, *, cases, started: float,
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


def verdict_text(status: Status, cases: list[CaseResult], timing: TimingStats | None) -> str:
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


@dataclasses.dataclass
class Sheet:
    """What every result of one submission carries, whichever stage decides it: its build, the
    audit's reasons for a review, its source for the hint, the clock of its stages, and when its
    grading began (the build's start: its wall time is the build's plus its own stages')."""
    base: dict
    started: float
    clock: StageClock

    @classmethod
    def start(cls, sub: Submission, build: BuildResult, ctx: GradeContext, source: str,
              waited_s: float) -> Sheet:
        started = time.monotonic() - build.elapsed_s - waited_s
        clock = StageClock(build.elapsed_s)
        clock.waited(waited_s)
        role = "calibration" if ctx.calibration and sub.role is Role.STUDENT else sub.role.value
        base = dict(id=sub.id, label=label_of(sub), kind=sub.kind.value, role=role, build=build,
                    source_text=read_source_text(sub), stage_s=clock,
                    review=() if ctx.calibration else audit_review(sub, build, source),
                    audit_notes=tuple(getattr(build, "audit_notes", ()) or ()))
        return cls(base, started, clock)

    def finish(self, status: Status, message: str, *, cases, notes=(), timing=None,
               timed_case=None, kernels=()) -> SubmissionResult:
        return finish(self.base, status, message, cases=cases, started=self.started, notes=notes,
                      timing=timing, timed_case=timed_case, kernels=kernels)


@dataclasses.dataclass
class CaseVerdict:
    """The verdict of the cases that ran, before any timing: the worst case's status, every case
    (in the run's order, those not run here among them), the notes, the submission's own kernel
    names and the kernels its calls launched; `flagged`: why library kernels rule it out."""
    status: Status
    cases: list[CaseResult]
    notes: list[str]
    own: object
    kernels: tuple
    flagged: str


def judge_cases(sub: Submission, build: BuildResult, ctx: GradeContext, source: str,
                plan: CasePlan, checked: list[CaseResult]) -> CaseVerdict:
    """What the run and check stages found: the cases' verdict and the kernels they launched."""
    status = worst(c.status for c in checked)
    cases = in_case_order(checked + plan.skipped, ctx.cases)
    notes = ran_where(ctx, cases) + plan.notes
    if not ctx.sandbox.active:
        notes.append(ctx.sandbox.describe())
    own = identity.own_kernels(source, sub.kind.value, getattr(build, "kernels", None))
    kernels = kernels_of(cases, None, source, sub, build)
    flagged = launch_findings([(c.case, c.launched) for c in cases], source, own, ctx)
    if flagged and ctx.calibration:
        notes.append(f"calibration run: library calls allowed ({flagged})")
        flagged = ""
    return CaseVerdict(status, cases, notes, own, kernels, flagged)


def judge_timed(sheet: Sheet, sub: Submission, build: BuildResult, ctx: GradeContext,
                source: str, timed: Case, judged: CaseVerdict,
                timed_run: TimedRun | tuple[Status, str]) -> SubmissionResult:
    """The result of a submission whose cases all passed, from its time stage: the failure's
    verdict, or its time with what the timed calls show (judge_timing): a time that stands, a
    note, or a reason it cannot rank."""
    cases, notes = judged.cases, judged.notes
    if isinstance(timed_run, tuple):
        status, message = timed_run
        return sheet.finish(status, message, cases=cases, notes=notes, kernels=judged.kernels)
    timing, timed_case = timed_run.stats, timed.id
    kernels = kernels_of(cases, timing, source, sub, build)
    sheet.clock.parts("time", timed_run.record.get("phases_s") or {})
    sheet.clock.parts("time.loop", timed_run.record.get("loop_s") or {})
    findings = judge_timing(timed_run, timed, source, judged.own, ctx)
    notes += [f.note for f in findings if f.note]   # what is unusual in a time that stands
    problems = [f for f in findings if f.status != Status.PASS.value]
    status, message = Status.PASS, ""
    if problems:
        status = worst(Status(f.status) for f in problems)
        message = "\n".join(f.message for f in problems if f.status == status.value)
        if any(f.impossible_time for f in problems):
            timing = None   # no page shows an impossible rate
        if status is Status.REVIEW:   # the timed calls' own reason for a review
            sheet.base = {**sheet.base, "review": tuple(sheet.base.get("review", ())) + (message,)}
            status = Status.PASS      # identity.with_review makes it `review`
    if status is Status.PASS:
        message = verdict_text(Status.PASS, cases, timing)
    return sheet.finish(status, message, cases=cases, timing=timing, timed_case=timed_case,
                        notes=notes, kernels=kernels)

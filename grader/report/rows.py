"""The leaderboard's rows, from the result files: who is scored, the baselines each row is
compared with, and the GPUs' agreement. Read by the pages and by the exports alike."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from grader.common.status import SEVERITY, Status
from grader.course.policy import Policy, Score
from grader.course.results import SubmissionResult
from grader.course.review import apply_decisions, load_decisions
from grader.report.privacy import Redactor


@dataclasses.dataclass(frozen=True)
class Row:
    """One leaderboard row: a submission or a baseline, with what the page shows of it."""
    result: SubmissionResult
    name: str                        # what the page calls it: id, pseudonym or baseline label
    rank: int | None
    previous_rank: int | None        # in the previous grading run, for rank movement
    speedup_vs_reference: float | None
    speedup_vs_flash: float | None
    percent_of_peak: float | None    # TFLOP/s over the GPU's fp16 matmul rate measured in the run
    score: Score | None              # None: not scored (no score, never a 0: see exports.is_scored)
    verdict: str = ""                # the message's first line; hidden shapes masked on public pages
    hidden_passed: int | None = None  # the students' page: hidden cases as a count only
    hidden_total: int | None = None
    gpu: str = ""                    # 'GPU 1': where it was graded, in a run on several GPUs

    @property
    def movement(self) -> int | None:
        """Places gained since the previous run (negative: lost); None if new or unranked."""
        if self.rank is None or self.previous_rank is None:
            return None
        return self.previous_rank - self.rank


def baseline_times(results: list[SubmissionResult]) -> dict[str, float]:
    return {r.id: r.timing.median_ms for r in results if r.role == "baseline" and r.timing}


def run_gpus(run: dict | None) -> list[dict]:
    """The GPUs a run graded on, one worker each (index, name, uuid, matmul_tflops); [] for a
    run on one GPU or none, and for runs from before GPU workers."""
    gpus = (run or {}).get("gpus") or []
    return gpus if len(gpus) > 1 else []


def baselines_by_gpu(results: list[SubmissionResult],
                     copies: list[SubmissionResult]) -> dict[int, dict[str, float]]:
    """Each GPU's baseline medians ({index: {baseline id: ms}}): the run's first GPU's from the
    results, the others' from their copies (results.read_gpu_copies)."""
    out: dict[int, dict[str, float]] = {}
    for r in [*results, *copies]:
        if r.role == "baseline" and r.timing and r.gpu is not None and r.gpu.index is not None:
            out.setdefault(r.gpu.index, {})[r.id] = r.timing.median_ms
    return out


def gpu_agreement(results: list[SubmissionResult], copies: list[SubmissionResult], run: dict, *,
                  leave_out: tuple[str, ...] = ()) -> dict | None:
    """How far the GPUs of a run on several disagree: each baseline's median on each GPU, and
    its spread (max - min) / min in percent; None for a run on one GPU. `leave_out`: baselines
    not shown (the solution on the students' page, when it is hidden)."""
    gpus = run_gpus(run)
    if not gpus:
        return None
    indices = [g.get("index") for g in gpus]
    by_gpu = baselines_by_gpu(results, copies)
    labels = {r.id: r.label for r in [*results, *copies]
              if r.role == "baseline" and r.id not in leave_out and not r.no_result}
    rows = []
    for id, label in labels.items():
        medians = [by_gpu.get(i, {}).get(id) for i in indices]
        got = [m for m in medians if m]
        spread = 100 * (max(got) - min(got)) / min(got) if len(got) >= 2 else None
        rows.append(dict(id=id, label=label, medians=medians, spread_pct=spread))
    spreads = [r["spread_pct"] for r in rows if r["spread_pct"] is not None]
    worst = max(spreads) if spreads else None
    names = ", ".join(f"GPU {g.get('index')}" for g in gpus)
    if worst is None:
        line = (f"Graded on {len(gpus)} GPUs ({names}), one submission at a time on each; no "
                f"baseline was timed on two of them, so whether they agree is not known.")
    elif worst > GPU_AGREEMENT_PCT:
        line = (f"The GPUs DISAGREE: the same baseline's median differs by up to {worst:.1f}% "
                f"between {names} (more than {GPU_AGREEMENT_PCT:g}%). Times from different GPUs "
                f"are not comparable to that precision: compare each row with the baselines of "
                f"its own GPU, or regrade on one GPU (--gpus).")
    else:
        line = (f"Graded on {len(gpus)} GPUs ({names}), one submission at a time on each; they "
                f"agree: the same baseline's median differs by at most {worst:.2f}% between "
                f"them (within {GPU_AGREEMENT_PCT:g}%).")
    return dict(gpus=[dict(index=g.get("index"), name=g.get("name", ""), uuid=g.get("uuid", ""))
                      for g in gpus],
                rows=rows, max_spread_pct=worst, agree=worst is not None and worst <= GPU_AGREEMENT_PCT,
                line=line)


def build_rows(results: list[SubmissionResult], *, run: dict | None = None,
               policy: Policy | None = None, previous: dict[str, int] | None = None,
               public: bool = False, gpu_copies: list[SubmissionResult] = ()) -> list[Row]:
    """Ranked rows first (by median time, baselines placed among them), then the rest.
    `public`: the student-facing view: pseudonyms, the solution hidden (as the policy says), and
    every result as privacy.Redactor shows it on that page (no hidden case, absolute path or
    real id; hidden cases only as a count). A run that cannot give grades scores no one.
    In a run on several GPUs a row's speedups, percent of peak and score thresholds are its own
    GPU's (the baselines timed there, `gpu_copies` for GPUs but the first), where there are."""
    policy = policy or Policy(pseudonyms=False, hide_solution=False)
    run = run or {}
    cases = run.get("cases", [])
    peak = run.get("device", {}).get("matmul_tflops") or None
    baselines = baseline_times(results)
    gpus = run_gpus(run)
    by_gpu = baselines_by_gpu(results, list(gpu_copies)) if gpus else {}
    peaks = {g.get("index"): g.get("matmul_tflops") for g in gpus}
    if public and policy.hide_solution:
        results = [r for r in results if not (r.role == "baseline" and r.id == "solution")]
    timed = sorted((r for r in results if r.ranked), key=lambda r: r.timing.median_ms)
    others = sorted((r for r in results if not r.ranked),
                    key=lambda r: (r.role != "student", r.status.value, r.label))
    names = {r.id: policy.pseudonym(r.id) for r in results if r.role == "student"} \
        if policy.pseudonyms else {}
    redactor = Redactor.for_run(run, names if public else {})
    grading = bool(cases) and why_no_grades(run) is None

    rows, rank = [], 0
    for r in timed + others:
        student = r.role == "student"
        if r.ranked and student:
            rank += 1
        t = r.timing.median_ms if r.ranked else None
        own = r.gpu.index if (gpus and r.gpu is not None) else None
        base = {**baselines, **by_gpu.get(own, {})}   # its own GPU's, else the first GPU's
        ref_ms, flash_ms = base.get("torch_reference"), base.get("sdpa_flash")
        row_peak = peaks.get(own) or peak
        name = names[r.id] if (public and student and names) else r.label
        shown = redactor.student_result(r, label=name, hidden_detail=False) if public else r
        if public and student and not r.ranked:   # the students' page shows a time only where it ranks
            shown = dataclasses.replace(shown, timing=None)
        hidden = [c for c in r.cases if redactor.is_hidden(c)] if public else []
        rows.append(Row(
            result=shown, name=name, rank=rank if (r.ranked and student) else None,
            previous_rank=(previous or {}).get(r.id) if student else None,
            speedup_vs_reference=ref_ms / t if (t and ref_ms) else None,
            speedup_vs_flash=flash_ms / t if (t and flash_ms) else None,
            percent_of_peak=100 * r.timing.tflops / row_peak if (t and row_peak) else None,
            score=policy.score(r, cases, base) if student and grading and is_scored(r) else None,
            verdict=shown.message.splitlines()[0] if shown.message else "",
            hidden_passed=sum(c.status is Status.PASS for c in hidden) if hidden else None,
            hidden_total=len(hidden) if hidden else None,
            gpu=r.gpu.label if (gpus and r.gpu is not None) else ""))
    return rows


def status_counts(rows: list[Row], missing: int = 0) -> list[tuple[str, int]]:
    """(status, count) of the students' rows, worst first, statuses with no row left out; the
    roster's students with no submission as `missing`."""
    counts = {s: 0 for s in [*SEVERITY, *(s for s in Status if s not in SEVERITY)]}
    for row in rows:
        if row.result.role == "student":
            counts[row.result.status] += 1
    out = [(s.value, n) for s, n in counts.items() if n]
    return out + ([("missing", missing)] if missing else [])


def counts_line(rows: list[Row], missing: int = 0) -> str:
    """'300 submissions: 212 pass · 41 mismatch · …', for the page and the terminal."""
    students = sum(1 for row in rows if row.result.role == "student")
    parts = " · ".join(f"{n} {s}" for s, n in status_counts(rows, missing))
    return f"{students} submission{'s' if students != 1 else ''}: {parts or 'none'}"


def reported(out_dir: Path, results: list[SubmissionResult]) -> list[SubmissionResult]:
    """The results as every report shows them: the instructors' review decisions recorded in
    `out_dir` applied (grader/course/review.py). The one place they are applied: the pages, grades,
    exports, feedback and the terminal table all come from what this returns."""
    return apply_decisions(results, load_decisions(out_dir))


GPU_AGREEMENT_PCT = 2.0   # the bar: the same kernel's median on two GPUs within 2%


def is_scored(r: SubmissionResult) -> bool:
    """Whether `r` may get points: not when the grading machine decided its outcome (`not_run`,
    `environment_error`: Status.scored), nor when another grader version's file lacked what
    scores it (its cases or timing: SubmissionResult.partial)."""
    return r.status.scored and not r.partial


def why_no_grades(run: dict) -> str | None:
    """Why this run's results cannot be grades (None: they can)."""
    if not run.get("device", {}).get("cuda"):
        return ("no CUDA device on the grading machine, so correctness was not checked (CUDA "
                "submissions were only compiled, Python ones ran the small cases on the CPU); "
                "grade on the GPU machine")
    if run.get("calibration"):
        return "a calibration run (library calls allowed, nothing ranked) is not a grading run"
    return None

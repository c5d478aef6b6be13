"""Report stage: the leaderboard pages, summary, grades and feedback, from the result files.

Everything here reads result JSON (never console text) and can be re-run at any time
(`python -m grader leaderboard`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
from pathlib import Path

import jinja2

from . import config
from .exports import write_exports
from .policy import Policy, Score, load_policy
from .results import SubmissionResult, read_results, write_json_atomic
from .status import Status

TEMPLATES = config.REPO_ROOT / "templates"
RUN_FILE = "_run.json"
SUMMARY_FILE = "_summary.json"
HISTORY_DIR = "history"


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
    score: Score | None
    verdict: str = ""                # the message's first line; hidden shapes masked on public pages

    @property
    def movement(self) -> int | None:
        """Places gained since the previous run (negative: lost); None if new or unranked."""
        if self.rank is None or self.previous_rank is None:
            return None
        return self.previous_rank - self.rank


def environment() -> jinja2.Environment:
    """The one jinja2 Environment: autoescape on for every template, so student-provided text
    (folder names, compiler output, messages) is always shown as text."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters["ms"] = lambda v: "" if v is None else f"{v:.3f}"
    env.filters["x"] = lambda v: "" if v is None else f"{v:.2f}×"
    return env


def baseline_times(results: list[SubmissionResult]) -> dict[str, float]:
    return {r.id: r.timing.median_ms for r in results if r.role == "baseline" and r.timing}


def build_rows(results: list[SubmissionResult], *, run: dict | None = None,
               policy: Policy | None = None, previous: dict[str, int] | None = None,
               public: bool = False) -> list[Row]:
    """Ranked rows first (by median time, baselines placed among them), then the rest.
    `public`: the student-facing view (pseudonyms and the solution hidden, as the policy says)."""
    policy = policy or Policy(pseudonyms=False, hide_solution=False)
    run = run or {}
    cases = run.get("cases", [])
    peak = run.get("device", {}).get("matmul_tflops") or None
    baselines = baseline_times(results)
    ref_ms, flash_ms = baselines.get("torch_reference"), baselines.get("sdpa_flash")
    if public and policy.hide_solution:
        results = [r for r in results if not (r.role == "baseline" and r.id == "solution")]
    timed = sorted((r for r in results if r.ranked), key=lambda r: r.timing.median_ms)
    others = sorted((r for r in results if not r.ranked),
                    key=lambda r: (r.role != "student", r.status.value, r.label))
    hidden_ids = [c["id"] for c in cases if c["hidden"]]

    def verdict(r: SubmissionResult) -> str:
        line = r.message.splitlines()[0] if r.message else ""
        if public:   # students never see the hidden cases' shapes
            for i, case_id in enumerate(hidden_ids, 1):
                line = line.replace(case_id, f"hidden case {i}")
        return line

    rows, rank = [], 0
    for r in timed + others:
        student = r.role == "student"
        if r.ranked and student:
            rank += 1
        t = r.timing.median_ms if r.ranked else None
        name = policy.pseudonym(r.id) if (public and policy.pseudonyms and student) else r.label
        rows.append(Row(
            result=r, name=name, rank=rank if (r.ranked and student) else None,
            previous_rank=(previous or {}).get(r.id) if student else None,
            speedup_vs_reference=ref_ms / t if (t and ref_ms) else None,
            speedup_vs_flash=flash_ms / t if (t and flash_ms) else None,
            percent_of_peak=100 * r.timing.tflops / peak if (t and peak) else None,
            score=policy.score(r, cases, baselines) if student and cases else None,
            verdict=verdict(r)))
    return rows


def chart(rows: list[Row], *, width: int = 760, bar_height: int = 18) -> dict | None:
    """Geometry of the inline SVG: one bar per timed row on a log scale of milliseconds, the
    baselines drawn as reference lines across the plot."""
    timed = [r for r in rows if r.result.timing]
    if not timed:
        return None
    lo = min(r.result.timing.median_ms for r in timed) / 1.5
    hi = max(r.result.timing.median_ms for r in timed) * 1.5
    left, right, top = 190, 20, 10
    plot = width - left - right

    def x(ms: float) -> float:
        return left + plot * (math.log(ms) - math.log(lo)) / (math.log(hi) - math.log(lo))

    bars = [dict(name=r.name, y=top + i * (bar_height + 4), x=left, w=max(1.0, x(r.result.timing.median_ms) - left),
                 ms=r.result.timing.median_ms, baseline=r.result.role == "baseline")
            for i, r in enumerate(timed)]
    height = top + len(bars) * (bar_height + 4) + 30
    lines = [dict(name=r.name, x=x(r.result.timing.median_ms)) for r in timed if r.result.role == "baseline"]
    ticks = [dict(x=x(v), label=f"{v:g} ms") for v in (10.0 ** e for e in range(-3, 6)) if lo <= v <= hi]
    return dict(width=width, height=height, left=left, top=top, bottom=height - 20, bar_height=bar_height,
                bars=bars, lines=lines, ticks=ticks)


def scope_notes(run: dict) -> list[str]:
    """What was and was not run, in plain words, for the top of the page."""
    device = run["device"]
    notes = []
    if run.get("sandboxed") is False:
        notes.append(f"WARNING: {run['sandbox']}. Submissions ran as plain processes: they could "
                     f"read the solution, the hidden cases and each other's code, and use the network.")
    if run.get("calibration"):
        notes.append("Calibration run: library calls were allowed and nothing is ranked.")
    if device["cuda"]:
        return notes + [f"Graded on {device['name']}: every case run and checked; the largest "
                        f"public case ({run['timed_case']}) timed."]
    return notes + ["No CUDA device on the grading machine: CUDA submissions were compile-checked "
                    "only (not run); Python submissions ran on the CPU on the small cases only "
                    f"(at most {config.CPU_MAX_FLOPS:.0e} FLOPs); nothing was timed."]


def run_id(run: dict) -> str:
    """A folder name for this grading run, from its start time: 20261121T103442Z."""
    return re.sub(r"[^0-9T]", "", run["started_at"].split("+")[0]) + "Z"


def previous_run(out_dir: Path, current: str) -> tuple[dict[str, int], list[str]]:
    """Ranks from the latest earlier run in history/, and the ids of all earlier runs."""
    history = out_dir / HISTORY_DIR
    earlier = sorted((p.name for p in history.iterdir() if p.is_dir() and p.name < current),
                     reverse=True) if history.is_dir() else []
    for name in earlier:
        try:
            summary = json.loads((history / name / SUMMARY_FILE).read_text())
        except (OSError, json.JSONDecodeError):
            continue
        return {row["id"]: row["rank"] for row in summary["rows"] if row.get("rank")}, earlier
    return {}, earlier


def write_reports(out_dir: Path, *, policy: Policy | None = None, archive: bool = False) -> dict[str, Path]:
    """Render everything from the result files in `out_dir`; with `archive`, keep a copy of this
    run's summary and pages in history/<run id>/. Returns the paths written."""
    policy = policy or load_policy()
    run = json.loads((out_dir / RUN_FILE).read_text())
    results = read_results(out_dir)
    current = run_id(run)
    previous, earlier = previous_run(out_dir, current)
    rows = build_rows(results, run=run, policy=policy, previous=previous)
    public_rows = build_rows(results, run=run, policy=policy, previous=previous, public=True)
    paths = dict(summary=out_dir / SUMMARY_FILE, leaderboard=out_dir / "leaderboard.html",
                 students=out_dir / "leaderboard-students.html")
    write_json_atomic(paths["summary"], summary(rows, run))
    history = [dict(id=h, href=f"{HISTORY_DIR}/{h}/leaderboard.html") for h in earlier]
    _write_text_atomic(paths["leaderboard"], render_leaderboard(rows, run, history=history))
    _write_text_atomic(paths["students"], render_leaderboard(public_rows, run, history=[], public=True))
    paths.update(write_exports(out_dir, rows, run, policy))
    if archive:
        keep = out_dir / HISTORY_DIR / current
        keep.mkdir(parents=True, exist_ok=True)
        for key in ("summary", "leaderboard", "students"):
            shutil.copy2(paths[key], keep / paths[key].name)
    return paths


def summary(rows: list[Row], run: dict) -> dict:
    counts = {s.value: 0 for s in Status}
    for row in rows:
        if row.result.role == "student":
            counts[row.result.status.value] += 1
    return dict(run=run, counts=counts, rows=[dict(
        rank=r.rank, previous_rank=r.previous_rank, id=r.result.id, label=r.result.label,
        role=r.result.role, status=r.result.status.value, message=r.result.message,
        median_ms=r.result.timing.median_ms if r.result.timing else None,
        tflops=r.result.timing.tflops if r.result.timing else None,
        speedup_vs_reference=r.speedup_vs_reference, speedup_vs_flash=r.speedup_vs_flash,
        percent_of_peak=r.percent_of_peak,
        score=r.score.total if r.score else None) for r in rows])


def render_leaderboard(rows: list[Row], run: dict, *, history: list[dict], public: bool = False) -> str:
    cases = run["cases"]
    return environment().get_template("leaderboard.html.j2").render(
        rows=rows, run=run, cases=cases, notes=scope_notes(run), Status=Status, chart=chart(rows),
        history=history, public=public)


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def text_table(rows: list[Row]) -> str:
    """The leaderboard as plain text, for terminals, logs and notes."""
    head = (f"{'#':>3}  {'submission':24} {'status':13} {'cases':>5} {'median ms':>10} "
            f"{'TFLOP/s':>8} {'vs ref':>7} {'wall s':>7}  verdict")
    out = [head, "-" * len(head)]
    for row in rows:
        r = row.result
        ran = [c for c in r.cases if c.status is not Status.NOT_RUN]
        cases = f"{sum(c.status is Status.PASS for c in ran)}/{len(ran)}" if ran else "-"
        out.append(f"{row.rank or '':>3}  {row.name[:24]:24} {r.status.value:13} {cases:>5} "
                   f"{(f'{r.timing.median_ms:.3f}' if r.timing else ''):>10} "
                   f"{(f'{r.timing.tflops:.1f}' if r.timing else ''):>8} "
                   f"{(f'{row.speedup_vs_reference:.2f}x' if row.speedup_vs_reference else ''):>7} "
                   f"{r.wall_s:7.1f}  {row.verdict[:60]}")
    peak = max((c.peak_memory_bytes or 0 for row in rows for c in row.result.cases), default=0)
    if peak:
        out.append(f"\npeak GPU memory of a correctness check (reference + comparison): "
                   f"{peak / 2**30:.2f} GiB")
    return "\n".join(out)

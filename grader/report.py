"""Report stage: summary JSON, grades CSV and the leaderboard page, all from the result files."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
from pathlib import Path

import jinja2

from . import config
from .results import SubmissionResult, read_results, write_json_atomic
from .status import Status

TEMPLATES = config.REPO_ROOT / "templates"
RUN_FILE = "_run.json"
SUMMARY_FILE = "_summary.json"


@dataclasses.dataclass(frozen=True)
class Row:
    """One leaderboard row: a submission or a baseline, with what the page shows of it."""
    result: SubmissionResult
    rank: int | None
    speedup_vs_reference: float | None
    speedup_vs_flash: float | None
    score: float | None


def environment() -> jinja2.Environment:
    """The one jinja2 Environment: autoescape on for every template, so student-provided text
    (folder names, compiler output, messages) is always shown as text."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters["ms"] = lambda v: "" if v is None else f"{v:.3f}"
    env.filters["x"] = lambda v: "" if v is None else f"{v:.2f}×"
    return env


def _baseline_ms(results: list[SubmissionResult], name: str) -> float | None:
    for r in results:
        if r.role == "baseline" and r.id == name and r.timing:
            return r.timing.median_ms
    return None


def score(result: SubmissionResult, *, slow_ms: float | None, fast_ms: float | None) -> float:
    """Placeholder policy until the grading-policy config lands: CORRECTNESS_POINTS spread
    evenly over the cases that ran, PERFORMANCE_POINTS linear in log(time) between the PyTorch
    reference (0) and SDPA FLASH (full), both measured in the same run."""
    ran = [c for c in result.cases if c.status is not Status.NOT_RUN]
    points = config.CORRECTNESS_POINTS * (sum(c.status is Status.PASS for c in ran) / len(ran)) if ran else 0.0
    if result.ranked and slow_ms and fast_ms and slow_ms > fast_ms:
        t = result.timing.median_ms
        frac = (math.log(slow_ms) - math.log(t)) / (math.log(slow_ms) - math.log(fast_ms))
        points += config.PERFORMANCE_POINTS * min(1.0, max(0.0, frac))
    return round(points, 2)


def build_rows(results: list[SubmissionResult]) -> list[Row]:
    """Ranked rows first (by median time, baselines placed among them), then the rest."""
    ref_ms, flash_ms = _baseline_ms(results, "torch_reference"), _baseline_ms(results, "sdpa_flash")
    timed = sorted((r for r in results if r.ranked), key=lambda r: r.timing.median_ms)
    others = sorted((r for r in results if not r.ranked),
                    key=lambda r: (r.role != "student", r.status.value, r.label))
    rows, rank = [], 0
    for r in timed + others:
        if r.ranked and r.role == "student":
            rank += 1
        t = r.timing.median_ms if r.ranked else None
        rows.append(Row(r, rank if (r.ranked and r.role == "student") else None,
                        ref_ms / t if (t and ref_ms) else None,
                        flash_ms / t if (t and flash_ms) else None,
                        score(r, slow_ms=ref_ms, fast_ms=flash_ms) if r.role == "student" else None))
    return rows


def scope_notes(run: dict) -> list[str]:
    """What was and was not run, in plain words, for the top of the page."""
    device = run["device"]
    if device["cuda"]:
        return [f"Graded on {device['name']}: every case run and checked; the largest public "
                f"case ({run['timed_case']}) timed."]
    return ["No CUDA device on the grading machine: CUDA submissions were compile-checked only "
            "(not run); Python submissions ran on the CPU on the small cases only "
            f"(at most {config.CPU_MAX_FLOPS:.0e} FLOPs); nothing was timed."]


def write_reports(out_dir: Path) -> dict[str, Path]:
    """Re-render everything from the result files in `out_dir`; returns the paths written."""
    run = json.loads((out_dir / RUN_FILE).read_text())
    results = read_results(out_dir)
    rows = build_rows(results)
    summary = dict(run=run, counts=_counts(results),
                   rows=[dict(rank=r.rank, id=r.result.id, label=r.result.label, role=r.result.role,
                              status=r.result.status.value, message=r.result.message,
                              median_ms=r.result.timing.median_ms if r.result.timing else None,
                              tflops=r.result.timing.tflops if r.result.timing else None,
                              speedup_vs_reference=r.speedup_vs_reference,
                              speedup_vs_flash=r.speedup_vs_flash, score=r.score) for r in rows])
    paths = dict(summary=out_dir / SUMMARY_FILE, grades=out_dir / "grades.csv",
                 leaderboard=out_dir / "leaderboard.html")
    write_json_atomic(paths["summary"], summary)
    _write_text_atomic(paths["grades"], grades_csv(rows))
    _write_text_atomic(paths["leaderboard"], render_leaderboard(rows, run))
    return paths


def _counts(results: list[SubmissionResult]) -> dict[str, int]:
    counts = {s.value: 0 for s in Status}
    for r in results:
        if r.role == "student":
            counts[r.status.value] += 1
    return counts


def grades_csv(rows: list[Row]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["submission", "status", "cases_passed", "cases_run", "hidden_passed", "median_ms",
                "tflops", "speedup_vs_reference", "rank", "score", "message"])
    for row in rows:
        r = row.result
        if r.role != "student":
            continue
        ran = [c for c in r.cases if c.status is not Status.NOT_RUN]
        w.writerow([r.id, r.status.value, sum(c.status is Status.PASS for c in ran), len(ran),
                    sum(c.status is Status.PASS and c.hidden for c in ran),
                    f"{r.timing.median_ms:.4f}" if r.timing else "",
                    f"{r.timing.tflops:.2f}" if r.timing else "",
                    f"{row.speedup_vs_reference:.3f}" if row.speedup_vs_reference else "",
                    row.rank or "", row.score, r.message.splitlines()[0] if r.message else ""])
    return buf.getvalue()


def render_leaderboard(rows: list[Row], run: dict) -> str:
    case_ids = [c["id"] for c in run["cases"]]
    return environment().get_template("leaderboard.html.j2").render(
        rows=rows, run=run, case_ids=case_ids, hidden={c["id"] for c in run["cases"] if c["hidden"]},
        notes=scope_notes(run), Status=Status)


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
        out.append(f"{row.rank or '':>3}  {r.label[:24]:24} {r.status.value:13} {cases:>5} "
                   f"{(f'{r.timing.median_ms:.3f}' if r.timing else ''):>10} "
                   f"{(f'{r.timing.tflops:.1f}' if r.timing else ''):>8} "
                   f"{(f'{row.speedup_vs_reference:.2f}x' if row.speedup_vs_reference else ''):>7} "
                   f"{r.wall_s:7.1f}  {(r.message.splitlines()[0] if r.message else '')[:60]}")
    peak = max((c.peak_memory_bytes or 0 for row in rows for c in row.result.cases), default=0)
    if peak:
        out.append(f"\npeak GPU memory of a correctness check (reference + comparison): "
                   f"{peak / 2**30:.2f} GiB")
    return "\n".join(out)

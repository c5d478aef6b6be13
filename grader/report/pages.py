"""Report stage: the leaderboard pages, summary, grades and feedback, from the result files.

Everything here reads result JSON (never console text) and can be re-run at any time
(`python -m grader leaderboard`). The instructors' review decisions (grader/course/review.py) are
applied in one place, `reported`, and everything is rendered from what it returns.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import shutil
import textwrap
from pathlib import Path

import jinja2

from grader.common import config
from grader.common.status import Status
from grader.course.policy import Policy, load_policy
from grader.course.results import SubmissionResult, read_gpu_copies, read_results, write_json_atomic
from grader.course.review import QueueEntry, folders_of, load_decisions, review_queue
from grader.course.roster import Roster, join, load_roster
from grader.report.exports import NotWritten, write_exports
from grader.report.feedback import status_detail, status_label
from grader.report.privacy import Redactor
from grader.report.rows import (Row, baselines_by_gpu, build_rows, counts_line, gpu_agreement,
                                reported, run_gpus, why_no_grades)
from grader.report.summary import SUMMARY_FILE, run_outcome, waiting_for_review

TEMPLATES = config.REPO_ROOT / "templates"
RUN_FILE = "_run.json"
HISTORY_DIR = "history"


def environment() -> jinja2.Environment:
    """The one jinja2 Environment: autoescape on for every template, so student-provided text
    (folder names, compiler output, messages) is always shown as text."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    # a result's status as the student's check prints it: cpu-pass when its cases ran on the CPU
    env.globals.update(status_label=status_label, status_detail=status_detail)
    env.filters["ms"] = lambda v: "" if v is None else f"{v:.3f}"
    env.filters["x"] = lambda v: "" if v is None else f"{v:.2f}×"
    env.filters["shquote"] = shlex.quote
    return env


def chart(rows: list[Row], *, width: int = 640, bar_height: int = 18, top_n: int = 15,
          bins: int = 32) -> dict | None:
    """Geometry of the inline SVG, on a log scale of milliseconds: one bar for each of the `top_n`
    fastest students and each baseline, then a histogram of every timed student (so the chart
    stays one screen tall at any class size), the baselines drawn as reference lines across both."""
    timed = [r for r in rows if r.result.ranked]   # a time that does not rank is not drawn
    if not timed:
        return None
    times = [r.result.timing.median_ms for r in timed]
    lo, hi = min(times) / 1.5, max(times) * 1.5
    left, right, top = 150, 50, 10
    plot = width - left - right

    def x(ms: float) -> float:
        return left + plot * (math.log(ms) - math.log(lo)) / (math.log(hi) - math.log(lo))

    students = [r for r in timed if r.result.role == "student"]
    shown = [r for r in timed if r.result.role == "baseline" or r in students[:top_n]]
    bars = [dict(name=r.name, y=top + i * (bar_height + 4), x=left,
                 w=max(1.0, x(r.result.timing.median_ms) - left), ms=r.result.timing.median_ms,
                 baseline=r.result.role == "baseline") for i, r in enumerate(shown)]
    hist_top = top + len(bars) * (bar_height + 4) + 24
    hist_height = 90 if len(students) > top_n else 0
    counts = [0] * bins
    for r in students:
        i = int((x(r.result.timing.median_ms) - left) / plot * bins)
        counts[min(bins - 1, max(0, i))] += 1
    peak = max(counts) or 1
    histogram = [dict(x=left + i * plot / bins, w=plot / bins - 1, n=n,
                      h=hist_height * n / peak, y=hist_top + hist_height - hist_height * n / peak,
                      lo=math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * i / bins),
                      hi=math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * (i + 1) / bins))
                 for i, n in enumerate(counts) if n] if hist_height else []
    bottom = hist_top + hist_height if hist_height else hist_top - 20
    lines = [dict(name=r.name, x=x(r.result.timing.median_ms)) for r in timed if r.result.role == "baseline"]
    ticks = [dict(x=x(v), label=f"{v:g} ms") for v in (10.0 ** e for e in range(-3, 6)) if lo <= v <= hi]
    return dict(width=width, height=bottom + 24, left=left, top=top, bottom=bottom,
                bar_height=bar_height, bars=bars, lines=lines, ticks=ticks, histogram=histogram,
                hist_top=hist_top, hist_height=hist_height, students=len(students),
                top_n=min(top_n, len(students)))


def scope_notes(run: dict, *, public: bool = False) -> list[str]:
    """What was and was not run, in plain words, for the top of the page."""
    device = run["device"]
    notes = []
    if why_no_grades(run):
        notes.append("No scores: this run could not check correctness; scores come from the "
                     "grading run on the course's GPU machine." if public else
                     f"No scores: {why_no_grades(run)}. grades.csv and the Canvas and Gradescope "
                     f"files were not written.")
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


def review_entries(out_dir: Path, results: list[SubmissionResult], run: dict, policy: Policy, *,
                   copies: list[SubmissionResult] | None = None,
                   with_source: bool = True) -> list[QueueEntry]:
    """The review queue of a run's results as graded (not yet `reported`): each row compared
    with the library baselines of its own GPU, its source read from the folder the run file
    records."""
    if copies is None:
        copies = read_gpu_copies(out_dir, run) if run_gpus(run) else []
    by_gpu = baselines_by_gpu(results, copies) if run_gpus(run) else {}
    return review_queue(results, load_decisions(out_dir), top=policy.review_top, by_gpu=by_gpu,
                        folders=folders_of(run), with_source=with_source)


def write_reports(out_dir: Path, *, policy: Policy | None = None, archive: bool = False,
                  roster: Path | Roster | None = None,
                  results: list[SubmissionResult] | None = None) -> dict[str, Path]:
    """Render everything from the result files in `out_dir` (`results`: the caller's, as read,
    decisions not applied); with `archive`, keep a copy of this run's summary and pages in
    history/<run id>/; with a `roster` (a CSV path or a loaded one), join the students to it
    (missing and extra submissions listed). Returns the paths written."""
    policy = policy or load_policy()
    roster = load_roster(roster) if isinstance(roster, (str, Path)) else roster
    run = json.loads((out_dir / RUN_FILE).read_text())
    graded = read_results(out_dir) if results is None else results
    copies = read_gpu_copies(out_dir, run) if run_gpus(run) else []   # baselines on other GPUs
    queue = review_entries(out_dir, graded, run, policy, copies=copies)
    results = reported(out_dir, graded)
    current = run_id(run)
    previous, earlier = previous_run(out_dir, current)
    rows = build_rows(results, run=run, policy=policy, previous=previous, gpu_copies=copies)
    public_rows = build_rows(results, run=run, policy=policy, previous=previous, public=True,
                             gpu_copies=copies)
    gpus = gpu_agreement(results, copies, run)
    public_gpus = gpu_agreement(results, copies, run,
                                leave_out=("solution",) if policy.hide_solution else ())
    joined = join(roster, [r for r in rows if r.result.role == "student"]) if roster else None
    paths = dict(summary=out_dir / SUMMARY_FILE, leaderboard=out_dir / "leaderboard.html",
                 students=out_dir / "leaderboard-students.html")
    outcome = run_outcome(out_dir, graded, run, policy=policy, roster=roster, copies=copies)
    write_json_atomic(paths["summary"], summary(rows, run, gpus=gpus, review=queue,
                                                outcome=outcome.to_dict()))
    history = [dict(id=h, href=f"{HISTORY_DIR}/{h}/leaderboard.html") for h in earlier]
    _write_text_atomic(paths["leaderboard"], render_leaderboard(rows, run, history=history, joined=joined,
                                                                gpus=gpus, review=queue,
                                                                review_top=policy.review_top))
    _write_text_atomic(paths["students"], render_leaderboard(public_rows, run, history=[], public=True,
                                                             missing=len(joined.missing) if joined else 0,
                                                             gpus=public_gpus))
    paths.update(write_exports(out_dir, rows, run, policy, roster=roster))
    if archive:
        keep = out_dir / HISTORY_DIR / current
        keep.mkdir(parents=True, exist_ok=True)
        for key in ("summary", "leaderboard", "students"):
            shutil.copy2(paths[key], keep / paths[key].name)
    return paths


def summary(rows: list[Row], run: dict, *, gpus: dict | None = None,
            review: list[QueueEntry] = (), outcome: dict | None = None) -> dict:
    """_summary.json: the run, the counts, the review queue, every row, and `outcome`
    (summary.Outcome: what the run leaves to do, its lists whole)."""
    counts = {s.value: 0 for s in Status}
    for row in rows:
        if row.result.role == "student":
            counts[row.result.status.value] += 1
    extra = dict(gpus=gpus) if gpus else {}
    if outcome is not None:
        extra["outcome"] = outcome
    return dict(run=run, counts=counts, **extra, review=[dict(
        id=e.id, status=e.result.status.value, graded=e.graded.value, rank=e.rank,
        reasons=list(e.reasons), pending=e.pending, stale=e.stale,
        decision=e.decision.to_dict() if e.decision else None) for e in review], rows=[dict(
        rank=r.rank, previous_rank=r.previous_rank, id=r.result.id, label=r.result.label,
        role=r.result.role, status=r.result.status.value, message=r.result.message,
        median_ms=r.result.timing.median_ms if r.result.timing else None,
        tflops=r.result.timing.tflops if r.result.timing else None,
        speedup_vs_reference=r.speedup_vs_reference, speedup_vs_flash=r.speedup_vs_flash,
        percent_of_peak=r.percent_of_peak,
        score=r.score.total if r.score else None,
        **(dict(gpu=r.result.gpu.index) if r.gpu else {})) for r in rows])


def render_leaderboard(rows: list[Row], run: dict, *, history: list[dict], public: bool = False,
                       joined=None, missing: int = 0, gpus: dict | None = None,
                       review: list[QueueEntry] = (), review_top: int = 10,
                       live: tuple[str, ...] = ()) -> str:
    """The page. `public`: the students' page (its rows from build_rows(public=True)), notes
    scrubbed of paths; `joined`: the roster join, listed on the instructors' page; `gpus`: a run
    on several GPUs (gpu_agreement): a GPU column, and how far the GPUs disagree; `review`: the
    review queue (review_entries), on the instructors' page only: the students' page never
    shows it, nor any source; `live`: the check service's page (grader/service/pages.py): these
    lines instead of the run's device line, and the page reloads itself. A run with no device
    known (a live page before anything was graded) has no scope notes."""
    if public:
        review = ()
    notes = scope_notes(run, public=public) if run.get("device") else []
    if gpus:
        notes.append(gpus["line"])
    if public:
        notes = [Redactor.for_run(run).text(n) for n in notes]
    missing = len(joined.missing) if joined else missing
    return environment().get_template("leaderboard.html.j2").render(
        rows=rows, run=run, cases=run["cases"], notes=notes, Status=Status, chart=chart(rows),
        history=history, public=public, joined=joined, counts_line=counts_line(rows, missing),
        gpus=gpus, review=list(review), review_top=review_top,
        review_waiting=sum(e.pending for e in review), live=list(live))


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def terminal_table(out_dir: Path, results: list[SubmissionResult], run: dict) -> str:
    """text_table of a run's results (as read: the review decisions are applied here), with the
    GPU column and agreement of a run on several, and a last line when review results wait for
    an instructor."""
    copies = read_gpu_copies(out_dir, run) if run_gpus(run) else []
    shown = reported(out_dir, results)
    table = text_table(build_rows(shown, run=run, gpu_copies=copies),
                       gpus=gpu_agreement(shown, copies, run))
    waiting = waiting_for_review(out_dir, results)
    if waiting:
        table += (f"\n{len(waiting)} submission{'s wait' if len(waiting) != 1 else ' waits'} for an "
                  f"instructor's review before ranking: python -m grader review --out {out_dir}")
    return table


def text_table(rows: list[Row], *, width: int | None = None, missing: int = 0,
               gpus: dict | None = None) -> str:
    """The leaderboard as plain text, for terminals, logs and notes: verdicts wrapped at word
    boundaries under their column, never cut, and a last line with the count of each status.
    `gpus` (gpu_agreement of a run on several GPUs): a GPU column, and each baseline's median
    on each GPU with how far they disagree."""
    gpu_col = f"{'gpu':>5} " if gpus else ""
    head = (f"{'#':>3}  {'submission':24} {'status':13} {'cases':>5} {'median ms':>10} "
            f"{'TFLOP/s':>8} {'vs ref':>7} {'wall s':>7} {gpu_col} verdict")
    indent = head.index("verdict")
    width = width or shutil.get_terminal_size((120, 24)).columns
    out = [head, "-" * max(len(head), width)]
    for row in rows:
        r = row.result
        ran = [c for c in r.cases if c.status is not Status.NOT_RUN]
        cases = f"{sum(c.status is Status.PASS for c in ran)}/{len(ran)}" if ran else "-"
        name = row.name if len(row.name) <= 24 else row.name[:23] + "…"
        line = (f"{row.rank or '':>3}  {name:24} {status_label(r).lower():13} {cases:>5} "
                f"{(f'{r.timing.median_ms:.3f}' if r.timing else ''):>10} "
                f"{(f'{r.timing.tflops:.1f}' if r.timing else ''):>8} "
                f"{(f'{row.speedup_vs_reference:.2f}x' if row.speedup_vs_reference else ''):>7} "
                f"{r.wall_s:7.1f} " + (f"{_gpu_index(row):>5} " if gpus else "") + " ")
        verdict = textwrap.wrap(row.verdict, max(30, width - indent), break_long_words=False,
                                break_on_hyphens=False) or [""]
        out.append(line + verdict[0])
        out += [" " * indent + more for more in verdict[1:]]
    peak = max((c.peak_memory_bytes or 0 for row in rows for c in row.result.cases), default=0)
    if peak:
        out.append(f"\npeak GPU memory of a correctness check (reference + comparison): "
                   f"{peak / 2**30:.2f} GiB")
    if gpus:
        out.append("\nper GPU, median ms of each baseline:")
        out.append(f"  {'baseline':24} " + " ".join(f"{'GPU ' + str(g['index']):>10}" for g in gpus["gpus"])
                   + f" {'spread':>8}")
        for b in gpus["rows"]:
            out.append(f"  {b['label'][:24]:24} "
                       + " ".join(f"{(f'{m:.3f}' if m else '-'):>10}" for m in b["medians"])
                       + f" {_pct(b['spread_pct']):>8}")
        out.append(gpus["line"])
    out.append("\n" + counts_line(rows, missing))
    return "\n".join(out)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}%"


def _gpu_index(row: Row) -> str:
    gpu = row.result.gpu
    return str(gpu.index) if row.gpu and gpu is not None and gpu.index is not None else ""


def where_reports_are(paths: dict, out: Path) -> str:
    """The files a run wrote, one line each; an export the run did not write says why."""
    def per_submission(key: str, suffix: str) -> str:
        return str(paths[key]) if isinstance(paths[key], NotWritten) else f"{paths[key]}/{suffix}"
    return (f"\nleaderboard: {paths['leaderboard']}\nfor students: {paths['students']}\n"
            f"grades:      {paths['grades']}\nresults:     {out}/<submission>.json\n"
            f"feedback:    {per_submission('feedback', '<submission>.md')}\n"
            f"gradescope:  {per_submission('gradescope', '<submission>/results.json')}")

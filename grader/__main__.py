"""Command line: a thin layer over the pipeline.

    python -m grader grade [SUBMISSIONS_DIR] [--out RESULTS_DIR]   # instructors
    python -m grader check PATH                                    # a student, on one folder
    python -m grader leaderboard [--out RESULTS_DIR]               # re-render from result files
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from . import config
from .baselines import BASELINES
from .cases import CaseFileError, largest, load_all_cases
from .device import detect
from .feedback import feedback_text
from .pipeline import GpuUnhealthy, GradeContext, grade_all, now
from .policy import PolicyError, load_policy
from .progress import Progress
from .report import RUN_FILE, build_rows, text_table, write_reports
from .results import read_results, write_json_atomic
from .roster import RosterError, load_roster
from .sandbox import Sandbox, SandboxUnavailable, default_layout
from .status import Status
from .submission import Role, discover, inspect_folder


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, help="results folder")
    p.add_argument("--build-dir", type=Path, default=config.DEFAULT_BUILD)
    p.add_argument("--cases", type=Path, default=config.PUBLIC_CASES, help="public test cases")
    p.add_argument("--hidden", type=Path, default=config.HIDDEN_CASES,
                   help="hidden test cases (used when the file exists)")
    p.add_argument("--no-hidden", action="store_true", help="public cases only")
    p.add_argument("--cpu", action="store_true", help="act as if there were no CUDA device")
    p.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1),
                   help="builds in parallel (default: the CPU cores, at most 8; nvcc is one process)")
    p.add_argument("--calibration", action="store_true",
                   help="timing calibration: library calls are allowed and nothing is ranked "
                        "(e.g. a submission that wraps SDPA FLASH, to compare with its baseline row)")


def _roster(p: argparse.ArgumentParser) -> None:
    # Issue 12: join the results to the course roster (grader/roster.py).
    p.add_argument("--roster", type=Path, help="course roster CSV: a 'folder' column and any of "
                   "sid, email, name, canvas_id (grades.csv gets them; canvas.csv and "
                   "gradescope_scores.csv are written)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m grader", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("grade", help="grade every submission folder and render the leaderboard")
    g.add_argument("submissions", nargs="?", type=Path, default=config.DEFAULT_SUBMISSIONS)
    _common(g)
    g.add_argument("--no-baselines", action="store_true", help="skip the PyTorch baseline rows")
    g.add_argument("--no-solution", action="store_true", help="skip the reference solution row")
    _roster(g)
    c = sub.add_parser("check", help="grade one submission folder and explain the result")
    c.add_argument("path", type=Path)
    _common(c)
    lb = sub.add_parser("leaderboard", help="re-render the page and exports from result files")
    lb.add_argument("--out", type=Path, default=config.DEFAULT_RESULTS)
    _roster(lb)
    return p


def _grade(subs, *, out: Path, args, baselines: list[str], quiet: bool = False) -> int:
    try:
        cases = load_all_cases(args.cases, None if args.no_hidden else args.hidden)
    except CaseFileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        policy = load_policy()
    except PolicyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args.build_dir = args.build_dir.resolve()
    device = detect(force_cpu=args.cpu)
    baselines = baselines if device.cuda else []   # PyTorch baselines are timed on a GPU only
    out.mkdir(parents=True, exist_ok=True)
    try:
        sandbox = Sandbox.probe(**default_layout())
    except SandboxUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not sandbox.active:
        print(f"\nWARNING: {sandbox.describe()}.\nSubmissions run as plain processes: they can read "
              f"the solution, the hidden cases and each other's code, and use the network.\n",
              file=sys.stderr)
    run = dict(started_at=now(), finished_at=None, device=device.to_dict(),
               sandbox=sandbox.describe(), sandboxed=sandbox.active, calibration=args.calibration,
               cases=[dict(id=c.id, hidden=c.hidden, line=c.line(), flops=c.flops) for c in cases],
               timed_case=largest(cases).id, rtol=config.RTOL, atol=config.ATOL,
               precision=dict(factor=policy.precision_factor, floor=policy.precision_floor),
               limits=vars(config.Limits.from_env()), submissions=[s.id for s in subs])
    write_json_atomic(out / RUN_FILE, run)
    where = device.name if device.cuda else "no CUDA device (compile checks and CPU runs only)"
    print(f"grading {len(subs)} submission(s) on {where}; {len(cases)} cases; results in {out}",
          file=sys.stderr)
    progress = Progress(len(subs) + len(baselines))
    ctx = GradeContext(cases=tuple(cases), device=device, limits=config.Limits.from_env(),
                       out_dir=out, build_dir=args.build_dir, progress=progress, sandbox=sandbox,
                       calibration=args.calibration,
                       precision=(policy.precision_factor, policy.precision_floor))
    t0 = time.monotonic()
    code = 0
    try:
        grade_all(subs, ctx, baselines=baselines, build_jobs=args.jobs)
    except GpuUnhealthy as e:
        progress.note(f"STOPPED: {e}")
        code = 3
    finally:
        progress.close()
        run.update(finished_at=now(), wall_s=round(time.monotonic() - t0, 1))
        write_json_atomic(out / RUN_FILE, run)
    paths = write_reports(out, archive=True, roster=getattr(args, "roster", None))
    if not quiet:
        print(text_table(build_rows(read_results(out), run=run)))
        print(f"\nleaderboard: {paths['leaderboard']}\nfor students: {paths['students']}\n"
              f"grades:      {paths['grades']}\nresults:     {out}/<submission>.json\n"
              f"feedback:    {paths['feedback']}/<submission>.md\ngradescope:  {paths['gradescope']}/<submission>/results.json")
    return code


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if getattr(args, "roster", None):   # a bad roster stops before grading, not after
        try:
            load_roster(args.roster)
        except RosterError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    if args.command == "leaderboard":
        if not (args.out / RUN_FILE).exists():
            print(f"error: {args.out} has no {RUN_FILE}; run 'python -m grader grade' first.",
                  file=sys.stderr)
            return 2
        paths = write_reports(args.out, roster=args.roster)
        run = json.loads((args.out / RUN_FILE).read_text())
        print(text_table(build_rows(read_results(args.out), run=run)))
        print(f"\nleaderboard: {paths['leaderboard']}\nfor students: {paths['students']}")
        return 0
    if args.command == "grade":
        try:
            subs = discover(args.submissions)
        except FileNotFoundError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if not args.no_solution and config.SOLUTION_DIR.is_dir():
            subs.append(inspect_folder(config.SOLUTION_DIR, role=Role.BASELINE, id="solution"))
        baselines = [] if args.no_baselines else list(BASELINES)
        return _grade(subs, out=args.out or config.DEFAULT_RESULTS, args=args, baselines=baselines)
    # check: one folder, no baselines, and the student-facing text
    sub = inspect_folder(args.path)
    out = args.out or config.DEFAULT_RESULTS / "check"
    code = _grade([sub], out=out, args=args, baselines=[], quiet=True)
    if code == 2:
        return code
    result = next(r for r in read_results(out) if r.id == sub.id)
    print(feedback_text(result))
    print(f"\nfull result: {out / (sub.id + '.json')}")
    return 0 if result.status in (Status.PASS, Status.NOT_RUN) else 1


if __name__ == "__main__":
    sys.exit(main())

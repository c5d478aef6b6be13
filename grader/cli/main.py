"""Command line: a thin layer over the pipeline.

    python -m grader grade [SUBMISSIONS_DIR] [--out RESULTS_DIR]   # instructors
    python -m grader check PATH                                    # a student, on one folder
    python -m grader leaderboard [--out RESULTS_DIR]               # re-render from result files
    python -m grader review [--out RESULTS_DIR] [ID [--clear | --disqualify] --note TEXT]
                                                                   # the review queue; decide
    python -m grader serve --roster roster.csv --store DIR         # the check service
    python -m grader serve tokens --roster roster.csv --store DIR  # the check service's tokens
    python -m grader submit --server URL [--check] FOLDER          # a student: send a folder to it
    python -m grader status --server URL [--wait] [ID]             # its queue place, then verdict
"""

# The docstring above is `--help`'s description. Here: the arguments, the dispatch, `leaderboard`
# and `review`; `grade` is in grader/cli/grade.py, `check` in grader/cli/check.py.

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from grader.common import config

from grader.executors import slurm
from grader.course.policy import POLICY_FILE, missing_baselines
from grader.report.pages import review_entries, terminal_table, write_reports
from grader.course.results import RunFileError, read_results, read_run
from grader.course.review import (DECISIONS, ReviewError, decision_problem, load_decisions, make_decision,
                     queue_text, record_decision)
from grader.course.roster import RosterError, load_roster
from grader.report.pages import where_reports_are
from grader.report.summary import outcome_text, run_outcome
from grader.cli.grade import _load_policy, grade_command
from grader.cli.check import check_command
from grader.cli import client, serve


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, help="results folder")
    p.add_argument("--build-dir", type=Path,
                   help="the build folder: the unpacked drop, the builds and the build cache "
                        "(default: build/<results folder's name>-<hash>/, one per results folder, so "
                        "runs with results folders of their own run side by side; and build/cache/, "
                        "which they share)")
    p.add_argument("--cases", type=Path, default=config.PUBLIC_CASES, help="public test cases")
    p.add_argument("--hidden", type=Path, default=config.HIDDEN_CASES,
                   help="hidden test cases (used when the file exists)")
    p.add_argument("--no-hidden", action="store_true", help="public cases only")
    p.add_argument("--cpu", action="store_true", help="act as if there were no CUDA device")
    p.add_argument("--jobs", type=int,
                   help="builds in parallel (default: one per CPU the builds run on, as many as "
                        "memory holds: cpus.default_build_jobs)")
    p.add_argument("--no-build-cache", action="store_true",
                   help="compile every CUDA submission, reusing no earlier build "
                        "(default: reuse a build whose inputs are unchanged; build/cache)")
    p.add_argument("--calibration", action="store_true",
                   help="timing calibration: library calls are allowed and nothing is ranked "
                        "(e.g. a submission that wraps SDPA FLASH, to compare with its baseline row)")
    _policy(p)


def _lanes(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= 16:
        raise argparse.ArgumentTypeError(f"--lanes {text!r}: give a whole number from 1 to 16 "
                                         f"(1: one submission at a time on each GPU)")
    return n


def _policy(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", type=Path, help=f"grading policy (default: {POLICY_FILE.name})")


def _roster(p: argparse.ArgumentParser) -> None:
    # Issue 12: join the results to the course roster (grader/course/roster.py).
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
    # Issue 11: a rerun skips what is unchanged (grader/course/runs.py).
    g.add_argument("--force", action="store_true",
                   help="regrade every submission, even those unchanged since their result")
    g.add_argument("--only", nargs="+", metavar="ID",
                   help="grade only these submissions (folder names); the others keep their results")
    _roster(g)
    # Issue 13: one GPU worker per GPU (grader/schedule/workers.py grade_all).
    g.add_argument("--gpus", metavar="SET",
                   help="the GPUs to grade on, one worker each: CUDA indices such as 0,1, or all "
                        "(default: every GPU of the first one's kind); without a GPU, one CPU worker")
    g.add_argument("--lanes", type=_lanes, default=config.GPU_LANES, metavar="N",
                   help=f"run and check stages of up to N submissions share each GPU; each time "
                        f"stage has it alone, on a fresh subject (grader/schedule/gate.py; default "
                        f"{config.GPU_LANES}; 1: one submission at a time)")
    slurm.add_arguments(g)   # issue 13: --executor slurm (grader/executors/slurm.py)
    c = sub.add_parser("check", help="grade one submission folder and explain the result")
    c.add_argument("path", type=Path)
    c.add_argument("--verbose", action="store_true",
                   help="CUDA: rebuild and show each kernel's registers, spills, stack and shared "
                        "memory (ptxas -v)")
    _common(c)
    slurm.add_arguments(c, workers=False)   # issue 15: the check as a Slurm job
    lb = sub.add_parser("leaderboard", help="re-render the page and exports from result files")
    lb.add_argument("--out", type=Path, default=config.DEFAULT_RESULTS)
    _roster(lb)
    _policy(lb)
    # Issue 30: the review queue and the instructors' decisions (grader/course/review.py).
    rv = sub.add_parser("review", help="list the review queue, or record an instructor's decision "
                                       "and re-render the page and exports")
    rv.add_argument("id", nargs="?", metavar="ID",
                    help="a submission: shown in full (its source too), or the one decided on")
    how = rv.add_mutually_exclusive_group()
    how.add_argument("--clear", dest="decision", action="store_const", const=DECISIONS[0],
                     help="cleared: a review result ranks with its measured time")
    how.add_argument("--disqualify", dest="decision", action="store_const", const=DECISIONS[1],
                     help="disqualified: flagged, the note as its verdict, never ranked")
    how.add_argument("--decision", choices=DECISIONS,
                     help="the same by name (make review ID=... DECISION=cleared|disqualified)")
    rv.add_argument("--note", default="",
                    help="why, in a sentence the student reads (required to disqualify)")
    rv.add_argument("--by", help="who decides (default: your login)")
    serve.add_arguments(sub)   # issue 33: the course check service (grader/cli/serve.py)
    client.add_arguments(sub)   # issue 33: submit and status, a student's (grader/cli/client.py)
    rv.add_argument("--out", type=Path, default=config.DEFAULT_RESULTS)
    _roster(rv)
    _policy(rv)
    return p


def _run_and_policy(args):
    """(run file, policy) of `leaderboard` and `review`, or None once the error is printed: a
    missing or truncated run file, or a malformed policy, is a clear line, not a traceback."""
    try:
        run = read_run(args.out)
    except RunFileError as e:
        print(f"error: {e}", file=sys.stderr)
        return None
    policy = _load_policy(args)
    return None if policy is None else (run, policy)


def _review(args) -> int:
    """`review`: the queue (one submission in full with its ID), or, with a decision, the
    decision recorded in the results folder and every report re-rendered exactly as
    `leaderboard` renders them, so that the page, grades and exports follow at once."""
    loaded = _run_and_policy(args)
    if loaded is None:
        return 2
    run, policy = loaded
    results = read_results(args.out, run)
    try:
        queue = review_entries(args.out, results, run, policy,
                               with_source=bool(args.id) and args.decision is None)
        decided = load_decisions(args.out)
    except ReviewError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.decision is None:
        if args.note:
            print("error: --note goes with --clear or --disqualify", file=sys.stderr)
            return 2
        shown = [e for e in queue if e.id == args.id] if args.id else queue
        students = {r.id: r for r in results if r.role == "student"}
        if args.id and args.id not in students:
            print(f"error: {decision_problem(args.id, DECISIONS[0], '', results, queue)}", file=sys.stderr)
            return 2
        if args.id and not shown:
            print(f"{args.id} is {students[args.id].status.value}: not in the review queue")
            return 0
        unknown = sorted(set(decided) - {r.id for r in results})
        print(queue_text(shown, out_dir=args.out, top=policy.review_top, full=bool(args.id),
                         unknown=unknown, width=shutil.get_terminal_size((120, 24)).columns))
        return 0
    if not args.id:
        print("error: name the submission to decide on: python -m grader review ID --clear|--disqualify "
              "--note TEXT", file=sys.stderr)
        return 2
    problem = decision_problem(args.id, args.decision, args.note, results, queue)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    graded = next(r for r in results if r.id == args.id)
    decision = make_decision(graded, args.decision, args.note,
                             by=args.by if args.by is not None else _login())
    path = record_decision(args.out, decision)
    print(f"recorded in {path}: {args.id} {decision.decision} (on source {decision.source[:12]}, "
          f"graded {decision.status}); re-rendering the reports", file=sys.stderr)
    code = main(["leaderboard", "--out", str(args.out),
                 *(["--roster", str(args.roster)] if args.roster else []),
                 *(["--policy", str(args.policy)] if args.policy else [])])
    if code:
        print(f"error: the decision is recorded, but the reports were not re-rendered: fix the "
              f"above, then run python -m grader leaderboard --out {args.out}", file=sys.stderr)
    return code


def _login() -> str:
    import getpass
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


def _leaderboard(args) -> int:
    """`leaderboard`: the page and exports re-rendered from the result files."""
    loaded = _run_and_policy(args)
    if loaded is None:
        return 2
    run, policy = loaded
    results = read_results(args.out)
    if run.get("baselines", True) and any(r.timing for r in results if r.role == "student"):
        lost = missing_baselines(policy, {r.id for r in results if r.role == "baseline" and r.timing})
        if lost:   # a result file of the run is gone: every ranked student would get 0
            print("\n".join(f"error: {args.out / 'baselines'}: {p}" for p in lost), file=sys.stderr)
            return 2
    paths = write_reports(args.out, roster=args.roster, policy=policy, results=results)
    print(terminal_table(args.out, results, run))
    print(where_reports_are(paths, args.out))
    # what is left to do, and the command that regrades it; a re-render exits 0 all the same
    print(outcome_text(run_outcome(args.out, results, run, policy=policy, roster=args.roster),
                       out_dir=args.out))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if getattr(args, "roster", None):   # a bad roster stops before grading, not after
        try:
            load_roster(args.roster)
        except RosterError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    if args.command == "review":
        return _review(args)
    if args.command in client.COMMANDS:
        return client.command(args)
    if args.command == "serve":
        return serve.serve_command(args)
    if args.command == "leaderboard":
        return _leaderboard(args)
    if args.command == "grade":
        return grade_command(args)
    # check: one folder, no baselines, and the student-facing text
    return check_command(args)


def run() -> None:
    """The process's entry (grader/__main__.py): main's code is its exit status."""
    try:
        sys.exit(main())
    except KeyboardInterrupt:   # outside grading (which handles its own): stop quietly
        print("\ninterrupted", file=sys.stderr)
        sys.exit(130)

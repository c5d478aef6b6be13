"""Command line: a thin layer over the pipeline.

    python -m grader grade [SUBMISSIONS_DIR] [--out RESULTS_DIR]   # instructors
    python -m grader check PATH                                    # a student, on one folder
    python -m grader leaderboard [--out RESULTS_DIR]               # re-render from result files
    python -m grader review [--out RESULTS_DIR] [ID [--clear | --disqualify] --note TEXT]
                                                                   # the review queue; decide
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import sys
import time
from pathlib import Path

from . import config, slurm
from .baselines import BASELINES
from .build import PTXAS_VERBOSE_ENV, BuildResult
from .build_cache import FOLDER as CACHE_FOLDER, BuildCache
from .cases import CaseFileError, largest, load_all_cases, load_cases, with_cases
from .device import GpuSelectionError, detect_gpus, parse_gpus
from .exports import NotWritten
from .feedback import feedback_text
from .intake import DropError, open_drop
from .locks import RunLock
from .pipeline import GpuUnhealthy, grade_all, gpu_records, grading_context, now
from .policy import POLICY_FILE, PolicyError, load_policy, missing_baselines
from .progress import Progress
from .report import review_entries, terminal_table, write_reports
from .results import RunFileError, read_results, read_run
from .review import (DECISIONS, ReviewError, decision_problem, load_decisions, make_decision,
                     queue_text, record_decision)
from .roster import RosterError, load_roster
from .runs import LockHeld, RunJournal, RunSession, check_only, previous_run_note
from .sandbox import Sandbox, SandboxUnavailable, default_layout
from .status import Status
from .submission import CUDA_FILE, PYTHON_FILE, Kind, Role, inspect_folder


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, help="results folder")
    p.add_argument("--build-dir", type=Path, default=config.DEFAULT_BUILD)
    p.add_argument("--cases", type=Path, default=config.PUBLIC_CASES, help="public test cases")
    p.add_argument("--hidden", type=Path, default=config.HIDDEN_CASES,
                   help="hidden test cases (used when the file exists)")
    p.add_argument("--no-hidden", action="store_true", help="public cases only")
    p.add_argument("--cpu", action="store_true", help="act as if there were no CUDA device")
    p.add_argument("--jobs", type=int,
                   help="builds in parallel (default: one per CPU the builds run on, as many as "
                        "memory holds: procs.default_build_jobs)")
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


def _load_policy(args):
    """The policy, checked whole before anything runs; None (and the lines printed) if bad."""
    try:
        return load_policy(args.policy or POLICY_FILE, required=args.policy is not None)
    except PolicyError as e:
        print(f"error: {e}", file=sys.stderr)
        return None


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
    # Issue 11: a rerun skips what is unchanged (grader/runs.py).
    g.add_argument("--force", action="store_true",
                   help="regrade every submission, even those unchanged since their result")
    g.add_argument("--only", nargs="+", metavar="ID",
                   help="grade only these submissions (folder names); the others keep their results")
    _roster(g)
    # Issue 13: one GPU worker per GPU (grader/pipeline.py grade_all).
    g.add_argument("--gpus", metavar="SET",
                   help="the GPUs to grade on, one worker each: CUDA indices such as 0,1, or all "
                        "(default: every GPU of the first one's kind); without a GPU, one CPU worker")
    g.add_argument("--lanes", type=_lanes, default=config.GPU_LANES, metavar="N",
                   help=f"run and check stages of up to N submissions share each GPU; each time "
                        f"stage has it alone, on a fresh subject (grader/gate.py; default "
                        f"{config.GPU_LANES}; 1: one submission at a time)")
    slurm.add_arguments(g)   # issue 13: --executor slurm (grader/slurm.py)
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
    # Issue 30: the review queue and the instructors' decisions (grader/review.py).
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
    rv.add_argument("--out", type=Path, default=config.DEFAULT_RESULTS)
    _roster(rv)
    _policy(rv)
    return p


def _devices(args) -> list | None:
    """The GPUs to grade on (--gpus; `check`: the first), or the CPU device; None (and the
    usage error printed) when --gpus is not a set of this machine's GPUs."""
    text = getattr(args, "gpus", None)
    try:
        wanted = parse_gpus(text) if args.command == "grade" else [0]
        devices = detect_gpus(wanted, force_cpu=args.cpu)
    except GpuSelectionError as e:
        print(f"error: {e}", file=sys.stderr)
        return None
    if text is not None and not devices[0].cuda:
        print(f"note: --gpus {text}: no CUDA device here; grading with one CPU worker", file=sys.stderr)
    return devices


def _grade(subs, *, out: Path, args, baselines: list[str], quiet: bool = False) -> int:
    devices = _devices(args)
    if devices is None:
        return 2
    device = devices[0]
    try:
        cases = load_all_cases(args.cases, None if args.no_hidden else args.hidden)
        if getattr(args, "cpu_cases", None) and not device.cuda:   # check, no GPU: cases it can run
            cases = with_cases(cases, load_cases(args.cpu_cases))
    except CaseFileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    policy = _load_policy(args)
    if policy is None:
        return 2
    args.build_dir = args.build_dir.resolve()
    baselines = baselines if device.cuda else []   # PyTorch baselines are timed on a GPU only
    if args.command == "grade" and device.cuda and not args.calibration:
        timed = set(baselines) | {s.id for s in subs if s.role is Role.BASELINE}
        for problem in missing_baselines(policy, timed):
            print(f"warning: {args.policy or POLICY_FILE}: {problem}", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    only = getattr(args, "only", None)
    problem = check_only(only, [s.id for s in subs] + baselines)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    session = RunSession(out, device=device, gpus=devices if device.cuda else ())
    try:   # one run at a time on a results folder, and on a GPU
        session.open()
    except LockHeld as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        return _grade_run(subs, out=out, args=args, baselines=baselines, quiet=quiet, cases=cases,
                          policy=policy, device=device, session=session,
                          only=set(only) if only else None, devices=devices)
    finally:
        session.close()


def _grade_run(subs, *, out: Path, args, baselines: list[str], quiet: bool, cases, policy, device,
               session: RunSession, only: set[str] | None, devices=()) -> int:
    for note in session.notes:
        print(f"note: {note}", file=sys.stderr)
    try:
        sandbox = Sandbox.probe(**default_layout())
    except SandboxUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not sandbox.active and args.command != "check":   # a student's own machine: no secrets
        print(f"\nWARNING: {sandbox.describe()}.\nSubmissions run as plain processes: they can read "
              f"the solution, the hidden cases and each other's code, and use the network.\n",
              file=sys.stderr)
    limits = config.Limits.from_env()
    run = dict(started_at=now(), finished_at=None, device=device.to_dict(),
               sandbox=sandbox.describe(), sandboxed=sandbox.active, calibration=args.calibration,
               cases=[dict(id=c.id, hidden=c.hidden, line=c.line(), flops=c.flops) for c in cases],
               timed_case=largest(cases).id, rtol=config.RTOL, atol=config.ATOL,
               precision=dict(factor=policy.precision_factor, floor=policy.precision_floor),
               limits=vars(limits), submissions=[s.id for s in subs],
               baselines=list(baselines), skipped=getattr(args, "skipped", []))
    gpus = [d for d in devices if d.cuda]   # one GPU worker each (grade --gpus)
    run["gpus"] = gpu_records(gpus)
    run["lanes"] = getattr(args, "lanes", 1)
    resumed = previous_run_note(out)
    if resumed:
        print(f"note: {resumed}", file=sys.stderr)
    journal = RunJournal(out, run)   # the run file, rewritten as results land
    where = device.name if device.cuda else "no CUDA device (compile checks and CPU runs only)"
    if len(gpus) > 1:
        where = f"{len(gpus)} GPUs, one worker each: " + ", ".join(d.label for d in gpus)
    print(f"grading {len(subs)} submission(s) on {where}; {len(cases)} cases; results in {out}",
          file=sys.stderr)
    progress = Progress(len(subs) + len(baselines))
    ctx = grading_context(cases=cases, device=device, gpus=gpus, limits=limits, out_dir=out,
                          build_dir=args.build_dir, progress=progress, sandbox=sandbox,
                          calibration=args.calibration, policy=policy,
                          build_cache=_build_cache(args, sandbox),
                          lanes=getattr(args, "lanes", 1), student_check=args.command == "check")
    t0 = time.monotonic()
    code = 0
    try:
        grade_all(subs, ctx, baselines=baselines, build_jobs=args.jobs,
                  force=getattr(args, "force", False), only=only, journal=journal)
    except GpuUnhealthy as e:
        progress.note(f"STOPPED: {e}")
        code = 3
    except KeyboardInterrupt:   # Ctrl-C, SIGTERM: children killed, finished results on disk
        code = 130
    finally:
        run.update(finished_at=now(), wall_s=round(time.monotonic() - t0, 1))
        journal.finish({0: "finished", 130: "interrupted"}.get(code, "stopped"))
        results = read_results(out, run)
        progress.close(interrupted=code == 130, missing=sum(1 for r in results if r.no_result))
    paths = write_reports(out, archive=True, roster=getattr(args, "roster", None), policy=policy,
                          results=results)
    if not quiet:
        print(terminal_table(out, results, run))
        print(where_reports_are(paths, out))
    return code


def _build_cache(args, sandbox: Sandbox) -> BuildCache | None:
    """The build cache in the build folder, unless --no-build-cache. Without an active sandbox
    it is off, and a grading run says so (grader/build_cache.py: only a sandboxed submission
    cannot write it); a student's check, which has no secrets to keep, says nothing."""
    if args.no_build_cache:
        return None
    cache = BuildCache(args.build_dir / CACHE_FOLDER, sandboxed=sandbox.active)
    if not cache.usable and args.command != "check":
        print(f"note: {cache.describe()}", file=sys.stderr)
    return cache


def where_reports_are(paths: dict, out: Path) -> str:
    """The files a run wrote, one line each; an export the run did not write says why."""
    def per_submission(key: str, suffix: str) -> str:
        return str(paths[key]) if isinstance(paths[key], NotWritten) else f"{paths[key]}/{suffix}"
    return (f"\nleaderboard: {paths['leaderboard']}\nfor students: {paths['students']}\n"
            f"grades:      {paths['grades']}\nresults:     {out}/<submission>.json\n"
            f"feedback:    {per_submission('feedback', '<submission>.md')}\n"
            f"gradescope:  {per_submission('gradescope', '<submission>/results.json')}")


def build_summary(build: BuildResult | None, device: dict, log: Path, *, verbose: bool) -> str:
    """For a CUDA check whose compile succeeded: the architecture the file was compiled for and,
    verbose, what ptxas said of each kernel (registers, spills, stack, shared memory), from the
    build log. '' after a compile that failed or did not finish: nothing was compiled."""
    if build is None or build.status is not Status.PASS:
        return ""
    arch = device.get("arch", config.DEFAULT_CUDA_ARCH)
    where = (f"the architecture of this machine's {device.get('name')}" if device.get("cuda") else
             "the course GPU's architecture (no GPU here: compiled, not run)")
    lines = [f"Compiled for sm_{arch}, {where}."]
    if not verbose:
        return (lines[0] + " Registers, spills and shared memory per kernel: make check VERBOSE=1 "
                "(python -m grader check --verbose).")
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return lines[0] + f" No build log at {log}."
    kernels = ptxas_report(text)
    if not kernels:
        return lines[0] + " ptxas reported no kernel (see the build log: " + str(log) + ")."
    lines.append("ptxas, per kernel (spills cost speed: registers that do not fit go to local memory):")
    width = max(len(k["kernel"]) for k in kernels)
    for k in kernels:
        lines.append(f"  {k['kernel']:{width}}  {k['registers']:>3} registers  "
                     f"{k['spill_stores']} B spill stores  {k['spill_loads']} B spill loads  "
                     f"{k['stack']} B stack  {k['smem']} B static shared memory")
    return "\n".join(lines)


_PTXAS_ENTRY = re.compile(r"ptxas info\s*: Compiling entry function '([^']+)' for '(\w+)'")
_PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_USED = re.compile(r"ptxas info\s*: Used (\d+) registers")
_PTXAS_SMEM = re.compile(r"(\d+) bytes smem")


def ptxas_report(text: str) -> list[dict]:
    """Each kernel ptxas compiled (-Xptxas=-v), in order, with its name demangled."""
    kernels, current = [], None
    for line in text.splitlines():
        m = _PTXAS_ENTRY.search(line)
        if m:
            current = dict(symbol=m.group(1), kernel=m.group(1), registers=0, spill_stores=0,
                           spill_loads=0, stack=0, smem=0)
            kernels.append(current)
            continue
        if current is None:
            continue
        m = _PTXAS_FRAME.search(line)
        if m:
            current.update(stack=int(m.group(1)), spill_stores=int(m.group(2)),
                           spill_loads=int(m.group(3)))
        m = _PTXAS_USED.search(line)
        if m:
            current["registers"] = int(m.group(1))
            smem = _PTXAS_SMEM.search(line)
            current["smem"] = int(smem.group(1)) if smem else 0
    names = _demangle([k["symbol"] for k in kernels])
    for k, name in zip(kernels, names):
        k["kernel"] = name
    return kernels


def _demangle(symbols: list[str]) -> list[str]:
    """C++ names for mangled symbols (binutils' c++filt; the symbols themselves without it),
    shortened to the kernel's name and template arguments."""
    import shutil
    import subprocess
    tool = shutil.which("c++filt")
    if not symbols or tool is None:
        return symbols
    try:
        out = subprocess.run([tool], input="\n".join(symbols), capture_output=True, text=True,
                             timeout=30).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return symbols
    if len(out) != len(symbols):
        return symbols
    return [re.sub(r"^void |\(.*\)$", "", name) for name in out]


NOT_SANDBOXED = "NOT SANDBOXED"   # how grader/sandbox.py's describe() starts without bubblewrap


def check_usage(path: Path) -> str:
    """Why `check PATH` cannot check PATH ('' if it can): it takes one submission folder, the
    one that holds submission.cu or submission.py. A missing path, a file, or a folder of
    several submissions is a mistake in the command, said as such, never a verdict."""
    files = f"{CUDA_FILE} or {PYTHON_FILE}"

    def command(folder) -> str:
        return f"make check SUBMISSION={folder}  (or: python -m grader check {folder})"

    if not path.exists():
        return (f"{path}: no such folder. Check the folder that holds your {files}, for "
                f"example: {command('student')}")
    if path.is_file():
        if path.name in (CUDA_FILE, PYTHON_FILE):
            return f"{path} is a file; check takes the folder that holds it: {command(path.parent)}"
        return (f"{path} is a file; check takes the folder that holds your {files}, for example: "
                f"{command('student')}")
    if _holds_submission(path):
        return ""
    try:
        inner = sorted(p.name for p in path.iterdir() if _holds_submission(p))
    except OSError as e:
        return f"{path}: cannot read this folder ({e.strerror})"
    if len(inner) == 1:
        return (f"{path} holds no {files} itself; its folder {inner[0]} does: "
                f"{command(path / inner[0])}")
    if inner:
        listed = ", ".join(inner[:5]) + (f" and {len(inner) - 5} more" if len(inner) > 5 else "")
        return (f"{path} holds {len(inner)} submissions ({listed}); check takes one: "
                f"{command(path / inner[0])}. To grade them all: make grade SUBMISSIONS={path}")
    return ""   # a folder with neither file: the verdict says what it holds and how to name it


def _holds_submission(folder: Path) -> bool:
    try:
        return folder.is_dir() and ((folder / CUDA_FILE).is_file() or (folder / PYTHON_FILE).is_file())
    except OSError:
        return False


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
    if args.command == "leaderboard":
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
        return 0
    if args.command == "grade":
        try:   # the cases and the policy are checked whole before the drop is even unpacked
            load_all_cases(args.cases, None if args.no_hidden else args.hidden)
        except CaseFileError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if _load_policy(args) is None:
            return 2
        scratch = args.build_dir.resolve() / config.DROP_SCRATCH
        try:   # unpacking replaces the folders another run may be grading from: one run at a time
            args.drop_lock = RunLock(scratch.parent / ".drop.lock", f"the unpacked drop in {scratch}")
            args.drop_lock.acquire()   # held until this process exits
        except LockHeld as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        try:   # a course's drop: folders, archives, Canvas or Gradescope exports (grader/intake.py)
            drop = open_drop(args.submissions, scratch=scratch)
        except DropError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        for s in drop.skipped:
            print(f"not graded: {s.entry}: {s.reason}", file=sys.stderr)
        subs, args.skipped = list(drop.submissions), [s.to_dict() for s in drop.skipped]
        if not args.no_solution and config.SOLUTION_DIR.is_dir():
            subs.append(inspect_folder(config.SOLUTION_DIR, role=Role.BASELINE, id="solution"))
        baselines = [] if args.no_baselines else list(BASELINES)
        if slurm.misuse(args):
            print(f"error: {slurm.misuse(args)}", file=sys.stderr)
            return 2
        if args.executor == "slurm":   # the same run, graded by Slurm tasks (grader/slurm.py)
            return slurm.grade(subs, out=args.out or config.DEFAULT_RESULTS, args=args,
                               baselines=baselines)
        return _grade(subs, out=args.out or config.DEFAULT_RESULTS, args=args, baselines=baselines)
    # check: one folder, no baselines, and the student-facing text
    problem = check_usage(args.path)
    if problem:   # a mistake in the command, not in the code: no verdict
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if slurm.misuse(args):
        print(f"error: {slurm.misuse(args)}", file=sys.stderr)
        return 2
    if args.executor == "slurm":   # this same check, run on a Slurm node (grader/slurm.py)
        return slurm.check(args, out=args.out or
                           config.DEFAULT_RESULTS / "check" / args.path.absolute().name)
    sub = inspect_folder(args.path)
    # A results folder per submission folder (results/check/triton, ...): checks of two tracks
    # run at once; a second check of the same folder is refused (its lock names --out).
    out = args.out or config.DEFAULT_RESULTS / "check" / sub.id
    # Without a GPU, a Python submission also runs on small public cases (the public ones are too
    # large for a CPU); a CUDA one is compile-checked only.
    args.cpu_cases = config.CPU_CHECK_CASES if sub.kind is Kind.PYTHON else None
    if args.verbose:   # the builds this run starts report on each kernel; an unchanged one is rebuilt
        os.environ[PTXAS_VERBOSE_ENV] = "1"
        args.force = True
    code = _grade([sub], out=out, args=args, baselines=[], quiet=True)
    if code in (2, 3, 130):
        return code
    result = next(r for r in read_results(out) if r.id == sub.id)
    # The sandbox keeps a course's secrets from submissions; a student's check has none to keep.
    print(feedback_text(dataclasses.replace(result, notes=tuple(
        n for n in result.notes if not n.startswith(NOT_SANDBOXED)))))
    if sub.kind is Kind.CUDA and result.build is not None and result.build.status is Status.PASS:
        try:
            device = read_run(out, complete=False).get("device", {})
        except RunFileError:
            device = {}
        print("\n" + build_summary(result.build, device, out / "logs" / f"{sub.id}.build.log",
                                   verbose=args.verbose))
    print(f"\nfull result: {out / (sub.id + '.json')}")
    if result.status in (Status.ENVIRONMENT_ERROR, Status.NO_RESULT):   # the machine's doing
        return 3
    return 0 if result.status in (Status.PASS, Status.NOT_RUN) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:   # outside grading (which handles its own): stop quietly
        print("\ninterrupted", file=sys.stderr)
        sys.exit(130)

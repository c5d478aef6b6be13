"""`python -m grader grade`: a course's drop unpacked and graded (grade_command), and the run
that `grade` and a student's `check` share (_grade): the GPUs, the cases and the policy checked,
the results folder locked, the sandbox probed, every submission graded, the reports written."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from grader.build.cache import FOLDER as CACHE_FOLDER, BuildCache
from grader.common import config
from grader.course.intake import DropError, open_drop
from grader.course.locks import drop_lock, run_build_dir
from grader.course.policy import POLICY_FILE, PolicyError, load_policy, missing_baselines
from grader.course.results import read_results
from grader.course.runs import LockHeld, RunJournal, RunSession, check_only, previous_run_note
from grader.course.submission import Role, inspect_folder
from grader.executors import slurm
from grader.isolation.device import GpuSelectionError, detect_gpus, parse_gpus
from grader.isolation.sandbox import Sandbox, SandboxUnavailable, default_layout
from grader.problem import BASELINES, CaseFileError, largest, load_all_cases, load_cases, with_cases
from grader.report.pages import terminal_table, where_reports_are, write_reports
from grader.report.progress import Progress
from grader.report.summary import exit_status, outcome_text, run_outcome
from grader.schedule.workers import grade_all
from grader.stages.context import GpuUnhealthy, gpu_records, grading_context, now


def _load_policy(args):
    """The policy, checked whole before anything runs; None (and the lines printed) if bad."""
    try:
        return load_policy(args.policy or POLICY_FILE, required=args.policy is not None)
    except PolicyError as e:
        print(f"error: {e}", file=sys.stderr)
        return None


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
    if args.command != "grade":   # a student's check decides its own status (grader/cli/check.py)
        return code
    code = exit_status(code, results)   # 4: an entry has no final verdict (report/summary.py)
    print(outcome_text(run_outcome(out, results, run, policy=policy,
                                   roster=getattr(args, "roster", None)), out_dir=out, code=code))
    return code


def _build_cache(args, sandbox: Sandbox) -> BuildCache | None:
    """The build cache, unless --no-build-cache: build/cache/, which every run of the clone shares
    (grader/build/cache.py: entries are renamed into place whole, so runs side by side may store
    and read at once), or the cache in --build-dir. Without an active sandbox it is off, and a
    grading run says so (only a sandboxed submission cannot write it); a student's check, which
    has no secrets to keep, says nothing."""
    if args.no_build_cache:
        return None
    cache = BuildCache(args.cache_root / CACHE_FOLDER, sandboxed=sandbox.active)
    if not cache.usable and args.command != "check":
        print(f"note: {cache.describe()}", file=sys.stderr)
    return cache


def grade_command(args) -> int:
    """`grade`: a course's drop unpacked and graded, with the baselines and the solution."""
    try:   # the cases and the policy are checked whole before the drop is even unpacked
        load_all_cases(args.cases, None if args.no_hidden else args.hidden)
    except CaseFileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    policy = _load_policy(args)
    if policy is None:
        return 2
    out = args.out or config.DEFAULT_RESULTS
    # A build folder per results folder (issue 32): runs with results folders of their own grade
    # side by side, sharing only the build cache in build/. --build-dir: that folder for both.
    own = args.build_dir is None
    args.cache_root = args.build_dir or config.DEFAULT_BUILD
    args.build_dir = (run_build_dir(out) if own else args.build_dir).resolve()
    scratch = args.build_dir / config.DROP_SCRATCH
    try:   # unpacking replaces the folders another run may be grading from: one run at a time
        args.drop_lock = drop_lock(args.build_dir, out, own=own)
        args.drop_lock.acquire()   # held until this process exits
    except LockHeld as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:   # a course's drop: folders, archives, Canvas or Gradescope exports (grader/course/intake.py)
        drop = open_drop(args.submissions, scratch=scratch, policy=policy)
    except DropError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if drop.summary:   # a service store: how many students, which upload counted, what was skipped
        print(drop.summary, file=sys.stderr)
    for s in drop.skipped:
        print(f"not graded: {s.entry}: {s.reason}", file=sys.stderr)
    subs, args.skipped = list(drop.submissions), [s.to_dict() for s in drop.skipped]
    if not args.no_solution and config.SOLUTION_DIR.is_dir():
        subs.append(inspect_folder(config.SOLUTION_DIR, role=Role.BASELINE, id="solution"))
    baselines = [] if args.no_baselines else list(BASELINES)
    if slurm.misuse(args):
        print(f"error: {slurm.misuse(args)}", file=sys.stderr)
        return 2
    if args.executor == "slurm":   # the same run, graded by Slurm tasks (grader/executors/slurm.py)
        return slurm.grade(subs, out=out, args=args, baselines=baselines)
    return _grade(subs, out=out, args=args, baselines=baselines)

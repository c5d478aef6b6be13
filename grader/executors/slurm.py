"""Grading on Slurm through submitit (issue 13): one array of worker tasks, one results folder.

The head (`grade --executor slurm`, where `make grade` runs: a login node will do) reads the drop,
takes the results folder's lock for the whole run, writes the run file, admits its workers (a
token in the folder, written under the lock: runs.WORKERS_FILE), and submits one array of N
tasks. Each task runs the grader's own grading (grade_all: same sandbox probe, device detection
and keys as a local run) on its shard of the submissions, on its node, writing each result into
the shared results folder as it lands; task 0 also times the PyTorch baselines. A task takes no
folder lock: it opens only while the folder admits its run's token, and stops when that changes.
The head follows the tasks, then merges what they planned (device, keys) into the run file and
writes the reports as a local run does. Ctrl-C or SIGTERM on the head cancels the tasks, waits
for them to stop, and reports what finished.

Shards are fixed (submissions sorted by kind then id, dealt round-robin): a task that dies loses
exactly its unfinished part, which the head names and a rerun grades, and no file-system locking
across nodes is needed. Everything under <results>/slurm/: submitit's scripts, pickles and logs
(jobs/), and each task's own run file (run-<token>/task-<i>.json).

Here: the command (its options, the head's run, `check --executor slurm`). What runs in a task:
slurm_tasks.py; submitit and squeue: slurm_jobs.py; the head following its tasks: slurm_follow.py.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from grader.common import config
from grader.problem import CaseFileError, largest, load_all_cases
from grader.isolation.device import DeviceInfo, detect
from grader.stages.context import now
from grader.course.policy import POLICY_FILE, PolicyError, load_policy
from grader.report.progress import Progress
from grader.report.summary import exit_status, outcome_text, run_outcome
from grader.course.results import read_results, write_json_atomic
from grader.course.runs import (WORKERS_FILE, LockHeld, RunJournal, RunSession, check_only,
                                previous_run_note)
from grader.course.submission import Submission
from grader.executors.slurm_follow import Follow, head_entries, merge_tasks
from grader.executors.slurm_jobs import (POLL_S, SlurmError, SlurmOptions, TaskView, _refused,
                                         log_tail, make_executor, queue_states, submit, update)
from grader.executors.slurm_tasks import FOLDER, CheckOutcome, WorkerSpec, run_check, shard, task_folder


# ---------------------------------------------------------------- options


def add_arguments(p, *, workers: bool = True) -> None:
    """The Slurm options of `grade` (`check`: without --slurm-workers) on an argparse parser."""
    p.add_argument("--executor", choices=("local", "slurm"), default="local",
                   help="where grading runs: here (local), or on Slurm nodes through submitit")
    p.add_argument("--partition", help="Slurm partition (--executor slurm)")
    if workers:
        p.add_argument("--slurm-workers", type=int, metavar="N",
                       help="Slurm array tasks, each grading a share of the submissions (default 1)")
    else:
        p.set_defaults(slurm_workers=None)
    p.add_argument("--slurm-time", type=int, metavar="MINUTES",
                   help="time limit of each task (default 240)")
    p.add_argument("--slurm-gpus-per-task", type=int, metavar="G",
                   help="GPUs per task (default 1; 0 with --cpu)")
    p.add_argument("--slurm-arg", action="append", metavar="KEY=VALUE",
                   help="any sbatch option, e.g. cpus-per-task=16, mem=64G, account=cs149 "
                        "(repeatable)")


def misuse(args) -> str:
    """Why the Slurm options cannot be used as given ('' if they can)."""
    given = [flag for flag, value in (("--partition", args.partition),
                                      ("--slurm-workers", args.slurm_workers),
                                      ("--slurm-time", args.slurm_time),
                                      ("--slurm-gpus-per-task", args.slurm_gpus_per_task),
                                      ("--slurm-arg", args.slurm_arg)) if value is not None]
    if given and args.executor != "slurm":
        return (f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} only to --executor slurm (make grade EXECUTOR=slurm "
                f"PARTITION=...); without it, grading runs here")
    return ""


# ---------------------------------------------------------------- the head


def not_graded(results, views: list[TaskView], spec: WorkerSpec) -> list[str]:
    """One line per task that left submissions without a result: which, and why."""
    missing = {(r.id, r.role) for r in results if r.no_result}
    lines = []
    for view in views:
        mine = shard(spec.subs, spec.workers, view.task)
        ids = [(s.id, s.role.value) for s in mine]
        if view.task == 0:
            ids += [(b, "baseline") for b in spec.baselines]
        lost = [id for id, role in ids if (id, role) in missing]
        if lost:
            shown = ", ".join(lost[:10]) + (f" and {len(lost) - 10} more" if len(lost) > 10 else "")
            why = view.state + (f": {view.message}" if view.message else "")
            lines.append(f"not graded by slurm task {view.task} (job {view.job.job_id}, {why}): "
                         f"{shown}; grade again to grade just these")
    return lines


def grade(subs: list[Submission], *, out: Path, args, baselines: list[str]) -> int:
    """`grade --executor slurm`: the head's whole run. Returns the exit status."""
    try:
        opts = SlurmOptions.from_args(args, len(subs))
        executor = make_executor(out, opts)
        cases = load_all_cases(args.cases, None if args.no_hidden else args.hidden)
        policy = load_policy(args.policy or POLICY_FILE, required=args.policy is not None)
    except (SlurmError, CaseFileError, PolicyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    problem = check_only(args.only, [s.id for s in subs] + baselines)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    head = detect(force_cpu=True)   # the head grades nothing and holds no GPU
    session = RunSession(out, device=head)
    try:
        session.open()
    except LockHeld as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        return _head_run(subs, out=out, args=args, baselines=baselines, cases=cases, opts=opts,
                         executor=executor, session=session, head=head, policy=policy)
    finally:
        (out / WORKERS_FILE).unlink(missing_ok=True)   # no task of this run writes any more
        session.close()


def _admit(out: Path, session: RunSession) -> None:
    """Under the folder's lock: stop the tasks of a head that was killed (they would stop at their
    next result anyway), forget their files, and admit this run's workers."""
    try:
        earlier = json.loads((out / WORKERS_FILE).read_text())
    except (OSError, ValueError):
        earlier = {}
    if isinstance(earlier, dict) and earlier.get("job"):
        subprocess.run(["scancel", str(earlier["job"])], capture_output=True, timeout=60)
    for old in (out / FOLDER).glob("run-*"):
        shutil.rmtree(old, ignore_errors=True)
    write_json_atomic(out / WORKERS_FILE, dict(token=session.token, pid=os.getpid(),
                                               host=socket.gethostname(), job=None))


def _head_run(subs, *, out: Path, args, baselines, cases, opts: SlurmOptions, executor,
              session: RunSession, head: DeviceInfo, policy) -> int:
    for note in session.notes:
        print(f"note: {note}", file=sys.stderr)
    _admit(out, session)
    spec = _worker_spec(args, out=out, token=session.token, subs=subs, baselines=baselines,
                        workers=opts.workers)
    task_folder(out, session.token).mkdir(parents=True, exist_ok=True)
    try:   # before the run file is touched: a refused job leaves the last run's as it was
        jobs = submit(executor, spec, opts)
    except SlurmError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    array_id = str(jobs[0].job_id).split("_")[0]
    write_json_atomic(out / WORKERS_FILE, dict(token=session.token, pid=os.getpid(),
                                               host=socket.gethostname(), job=array_id))
    resumed = previous_run_note(out)
    if resumed:
        print(f"note: {resumed}", file=sys.stderr)
    run = _run_record(args, head=head, cases=cases, subs=subs, baselines=baselines, opts=opts,
                      policy=policy)
    journal = RunJournal(out, run)
    entries = head_entries(subs, baselines)
    merge_tasks(run, out, entries, [])
    journal.write()
    progress = Progress(len(subs) + (0 if args.cpu else len(baselines)))
    progress.note(f"submitted job {array_id}: {opts.workers} task(s) on partition "
                  f"{opts.partition} grading {len(subs)} submission(s); results in {out}; logs in "
                  f"{executor.folder}")
    follow, t0, code = Follow(spec, jobs, progress, journal, entries), time.monotonic(), 0
    try:
        follow.wait()
    except KeyboardInterrupt:   # Ctrl-C, SIGTERM: cancel the tasks, report what finished
        code = 130
        follow.cancel()
    if code == 0 and any(v.state != "finished" for v in follow.views):
        code = 3
    merge_tasks(run, out, entries, follow.views)
    run.update(finished_at=now(), wall_s=round(time.monotonic() - t0, 1))
    journal.finish({0: "finished", 130: "interrupted"}.get(code, "stopped"))
    results = read_results(out, run)
    progress.close(interrupted=code == 130, missing=sum(1 for r in results if r.no_result))
    for line in not_graded(results, follow.views, spec):
        print(line, file=sys.stderr)
    code = exit_status(code, results)   # as a local run's (grader/report/summary.py)
    _report(out, args, results, run, policy, code=code)
    return code


def _worker_spec(args, *, out: Path, token: str, subs, baselines, workers: int) -> WorkerSpec:
    """What every task gets: this run's inputs, every path absolute."""
    return WorkerSpec(out=out.resolve(), token=token, subs=tuple(subs), baselines=tuple(baselines),
                      workers=workers, build_dir=args.build_dir.resolve(),
                      cache_root=args.cache_root.resolve(),
                      cases=args.cases.resolve(),
                      hidden=None if args.no_hidden else args.hidden.resolve(), cpu=args.cpu,
                      jobs=args.jobs, build_cache=not args.no_build_cache,
                      calibration=args.calibration,
                      policy=args.policy.resolve() if args.policy else None, force=args.force,
                      only=tuple(args.only) if args.only else None)


def _run_record(args, *, head: DeviceInfo, cases, subs, baselines, opts: SlurmOptions,
                policy) -> dict:
    """The run file as the head starts it; the device, sandbox and keys come from the tasks."""
    return dict(started_at=now(), finished_at=None, device=head.to_dict(),
                sandbox="(on the Slurm nodes)", sandboxed=False, calibration=args.calibration,
                cases=[dict(id=c.id, hidden=c.hidden, line=c.line(), flops=c.flops) for c in cases],
                timed_case=largest(cases).id, rtol=config.RTOL, atol=config.ATOL,
                precision=dict(factor=policy.precision_factor, floor=policy.precision_floor),
                limits=vars(config.Limits.from_env()), submissions=[s.id for s in subs],
                baselines=list(baselines), skipped=getattr(args, "skipped", []),
                executor=dict(kind="slurm", partition=opts.partition, workers=opts.workers))


def _report(out: Path, args, results, run: dict, policy, *, code: int) -> None:
    """The pages and exports, the text table and the run's summary, exactly as a local run
    writes them."""
    from grader.report.pages import where_reports_are
    from grader.report.pages import terminal_table, write_reports
    paths = write_reports(out, archive=True, roster=getattr(args, "roster", None),
                          results=results, policy=policy)
    print(terminal_table(out, results, run))   # with the instructors' review decisions applied
    print(where_reports_are(paths, out))
    print(outcome_text(run_outcome(out, results, run, policy=policy,
                                   roster=getattr(args, "roster", None)), out_dir=out, code=code))


# ---------------------------------------------------------------- check on the course's nodes


def check_argv(args, out: Path) -> list[str]:
    """The `check` command line for the node, every path absolute, without the Slurm options."""
    argv = ["check", str(args.path.resolve()), "--out", str(out.resolve()),
            "--cases", str(args.cases.resolve())]
    if args.build_dir is not None:   # else the node's check derives it from --out, as here
        argv += ["--build-dir", str(args.build_dir.resolve())]
    argv += ["--no-hidden"] if args.no_hidden else ["--hidden", str(args.hidden.resolve())]
    argv += [flag for flag, on in (("--cpu", args.cpu), ("--no-build-cache", args.no_build_cache),
                                   ("--calibration", args.calibration),
                                   ("--verbose", args.verbose)) if on]
    if args.jobs is not None:
        argv += ["--jobs", str(args.jobs)]
    if args.policy:
        argv += ["--policy", str(args.policy.resolve())]
    return argv


def check(args, *, out: Path) -> int:
    """`check --executor slurm`: the student's check as one Slurm job on the course's nodes; prints
    what `check` prints there and returns its exit status (2: a usage error here)."""
    try:
        opts = SlurmOptions.from_args(args, 1)
        executor = make_executor(out, opts)
    except SlurmError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        job = executor.submit(run_check, check_argv(args, out), max(60, opts.time_min * 60 - 60))
    except Exception as e:
        print(f"error: {_refused(e, opts)}", file=sys.stderr)
        return 2
    print(f"submitted job {job.job_id} on partition {opts.partition}; its log: {job.paths.stderr}",
          file=sys.stderr)
    view = TaskView(0, job)
    try:
        while not view.over:
            update(view, None, queue_states(str(job.job_id)))
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        subprocess.run(["scancel", str(job.job_id)], capture_output=True, timeout=60)
        print(f"\ninterrupted: cancelled job {job.job_id}", file=sys.stderr)
        return 130
    if not isinstance(view.value, CheckOutcome):
        print(f"error: the check's job {job.job_id} {view.state}: {view.message}\n"
              f"{log_tail(job)}", file=sys.stderr)
        return 3
    sys.stderr.write(view.value.stderr)
    sys.stdout.write(view.value.stdout)
    return view.value.code

"""`python -m grader serve`: the course check service (issue 33).

    python -m grader serve --roster R --store D [--host H] [--port P] [--gpus 0,1]
                           [--executor slurm --partition ...] [--policy grading.toml]
    python -m grader serve tokens --roster R --store D [--revoke FOLDER [--reissue]]

`serve` runs the HTTP service and its grading worker in one process (grader/service/server.py):
the store locked first (a second service on it exits 2 naming the holder's pid), then the jobs a
killed service left queued again, the worker, and uvicorn. The worker grades each job with
`make grade`'s own pipeline (_grade, or the Slurm executor's), run as `grade` runs it on the
course's machine: a check on the public cases (on a machine without a GPU, a Python one also on
the small CPU cases, as `make check` does), a submission on every case. Its chatter goes to the
job's log (STORE/work/<job>/grade.log), not the service's.

`serve tokens` issues, revokes and reissues the students' tokens (grader/service/tokens.py);
what it prints says where the tokens are and what to do next."""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import threading
from pathlib import Path

from grader.cli.grade import _grade, _load_policy
from grader.common import config
from grader.course.locks import LockHeld, gpu_lock
from grader.course.results import RUN_FILE, read_results, read_run
from grader.course.roster import RosterError, load_roster
from grader.course.submission import Kind, inspect_folder
from grader.executors import slurm
from grader.executors.slurm_jobs import SlurmError, SlurmOptions
from grader.isolation.device import GpuSelectionError, detect_gpus, parse_gpus
from grader.problem import CaseFileError, load_all_cases
from grader.service.server import DEFAULT_HOST, DEFAULT_PORT, serve, unavailable, url_of
from grader.service.store import Store, StoreBusy
from grader.service.tokens import INSTRUCTOR_TOKEN, TOKENS_CSV, TokenError, issue, revoke
from grader.service.worker import Early, GradeFn, GradeJob, Graded, GradingFailed, MachineBusy


def add_arguments(sub) -> None:
    """The `serve` command (the service itself) and its `tokens` action."""
    sv = sub.add_parser("serve", help="the course check service: students upload, the course's "
                                      "GPUs grade, a live leaderboard (issue 33); or its tokens")
    sv.add_argument("--store", type=Path, help="the service's store folder (its database, the "
                                               "uploads, each job's folder)")
    sv.add_argument("--roster", type=Path, help="course roster CSV (a 'folder' column)")
    sv.add_argument("--host", default=DEFAULT_HOST,
                    help=f"address to listen on (default {DEFAULT_HOST}: this machine only; "
                         f"put a TLS reverse proxy in front for students)")
    sv.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    sv.add_argument("--gpus", metavar="SET",
                    help="the GPUs to grade on: CUDA indices such as 0,1, or all (default: every "
                         "GPU of the first one's kind); without a GPU, the CPU")
    sv.add_argument("--cases", type=Path, default=config.PUBLIC_CASES, help="public test cases")
    sv.add_argument("--hidden", type=Path, default=config.HIDDEN_CASES,
                    help="hidden test cases (a submission runs them, a check never)")
    sv.add_argument("--cpu", action="store_true", help="act as if there were no CUDA device")
    sv.add_argument("--policy", type=Path,
                    help="grading policy (default: grading.toml; its [service] limits)")
    slurm.add_arguments(sv)   # --executor slurm: each batch of jobs graded as `grade` grades there
    actions = sv.add_subparsers(dest="serve_command", metavar="{tokens}")
    tk = actions.add_parser("tokens", help="a token for each roster student without one (STORE/"
                                           f"{TOKENS_CSV}) and the instructor's; or --revoke one")
    tk.add_argument("--store", type=Path, required=True, help="the service's store folder")
    tk.add_argument("--roster", type=Path, help="course roster CSV (a 'folder' column)")
    tk.add_argument("--revoke", metavar="FOLDER", help="revoke this student's token at once")
    tk.add_argument("--reissue", action="store_true", help="with --revoke: and give a new one")


def serve_command(args: argparse.Namespace) -> int:
    if args.serve_command == "tokens":
        return _tokens(args)
    return _serve(args)


def _serve(args: argparse.Namespace) -> int:
    """The service and its worker, until Ctrl-C or SIGTERM."""
    if args.store is None or args.roster is None:
        return _error("give --roster roster.csv and --store DIR (make serve ROSTER=... STORE=...)")
    problem = unavailable() or slurm.misuse(args)
    if problem:
        return _error(problem)
    try:   # everything a job needs, checked before the store is touched
        roster = load_roster(args.roster)
        load_all_cases(args.cases, args.hidden)
        if args.executor == "slurm":   # a partition, sane numbers: not a failure per job later
            SlurmOptions.from_args(args, 1)
    except (RosterError, CaseFileError, SlurmError) as e:
        return _error(str(e))
    policy = _load_policy(args)
    if policy is None:
        return 2
    store = Store(args.store)
    try:
        store.lock()
    except (StoreBusy, OSError) as e:
        store.close()
        return _error(str(e))
    try:
        where, gpus = _grading_on(args)
    except GpuSelectionError as e:
        store.close()
        return _error(str(e))
    missing = [s.folder for s in roster.students if s.folder not in store.live_folders()]
    if missing:
        print(f"warning: {len(missing)} roster student(s) have no token ({', '.join(missing[:5])}"
              f"{' ...' if len(missing) > 5 else ''}): python -m grader serve tokens --roster "
              f"{args.roster} --store {args.store}", file=sys.stderr)
    url = url_of(args.host, args.port)

    def announce() -> str:
        return (f"service: {url} (store {args.store}, {_students(len(roster.students))}, grading "
                f"on {where}); give each student their line of {args.store / TOKENS_CSV}: "
                f"make submit SERVER={url} TOKEN=<their token> [KIND=check]; Ctrl-C stops it")

    try:
        serve(store, policy, host=args.host, port=args.port, grade=pipeline(args, gpus),
              slots=(args.slurm_workers or 1) if args.executor == "slurm" else max(1, len(gpus)),
              announce=announce)
    except KeyboardInterrupt:
        pass
    print("service: stopped; the jobs not yet graded wait in the store for its next start",
          file=sys.stderr)
    return 0


def _students(n: int) -> str:
    return f"{n} student{'' if n == 1 else 's'}"


def _grading_on(args) -> tuple[str, list]:
    """Where jobs are graded, in words, and the GPUs (a batch takes one job per GPU, or per
    Slurm task)."""
    if args.executor == "slurm":
        return (f"Slurm partition {args.partition}, {args.slurm_workers or 1} task(s) a batch",
                [])
    devices = detect_gpus(parse_gpus(args.gpus), force_cpu=args.cpu)
    gpus = [d for d in devices if d.cuda]
    if not gpus:
        return "the CPU (no CUDA device: Python cases on the CPU, CUDA compile-checked only)", []
    return ", ".join(d.label for d in gpus), gpus


def pipeline(args: argparse.Namespace, gpus=()) -> GradeFn:
    """The worker's GradeFn: a batch of jobs graded by `grade`'s run (_grade, or the Slurm
    executor's), into the batch's results folder; GradingFailed when the run itself failed,
    MachineBusy when another run (`make grade`) holds one of `gpus`: the jobs wait for it."""
    def grade(jobs: list[GradeJob], early: Early | None = None) -> dict[str, Graded]:
        _gpus_free(gpus)
        subs = [inspect_folder(j.folder, id=j.student) for j in jobs]
        out, kind = jobs[0].out, jobs[0].kind
        run_args = _run_args(args, kind, subs, build=jobs[0].build)
        log = out.parent / "grade.log"
        # An earlier attempt's results (a stopped or failed run of a batch with the same first
        # job) are not this run's: none may be taken for a job before this run writes its own.
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True, exist_ok=True)
        with open(log, "a", encoding="utf-8") as f, contextlib.redirect_stdout(f), \
                contextlib.redirect_stderr(f), _each_result(out, jobs, early):
            if args.executor == "slurm":
                code = slurm.grade(subs, out=out, args=run_args, baselines=[])
            else:
                code = _grade(subs, out=out, args=run_args, baselines=[], quiet=True)
        if code in (2, 3, 130):   # a usage error, a GPU that failed, interrupted: not a verdict
            raise GradingFailed(f"the grading run exited {code}; its log: {log}")
        return _graded(out, jobs, complete=True)
    return grade


def _graded(out: Path, jobs: list[GradeJob], *, complete: bool) -> dict[str, Graded]:
    """The jobs' results written so far in the run's results folder, by job id (`complete`: the
    run has ended, and its run file must say everything the pages need)."""
    if not complete and not (out / RUN_FILE).exists():
        return {}
    run = read_run(out, complete=complete)
    if "cases" not in run:
        return {}
    results = {r.id: r for r in read_results(out, run) if r.role == "student"}
    return {j.id: Graded(results[j.student], run["cases"]) for j in jobs
            if j.student in results and not results[j.student].no_result}


@contextlib.contextmanager
def _each_result(out: Path, jobs: list[GradeJob], early: Early | None, every_s: float = 2.0):
    """While the run grades, each job's result said to `early` as soon as its file is written
    (results are written whole, write_json_atomic), so that a student whose submission came
    first in a batch does not wait for the batch's last."""
    if early is None:
        yield
        return
    stop = threading.Event()

    def watch() -> None:
        said: set[str] = set()
        while not stop.wait(every_s):
            try:
                found = _graded(out, jobs, complete=False)
            except Exception:   # a run file being replaced, or not yet there: look again
                continue
            for job_id, graded in found.items():
                if job_id not in said:
                    said.add(job_id)
                    early(job_id, graded)

    watcher = threading.Thread(target=watch, name="results-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()


def _gpus_free(gpus) -> None:
    """MachineBusy when another run holds one of `gpus` (their locks taken and let go at once:
    the run then takes them itself)."""
    taken = []
    try:
        for g in gpus:
            lock = gpu_lock(g.uuid or f"index{g.index}", g.name)
            lock.acquire()
            taken.append(lock)
    except LockHeld as e:
        raise MachineBusy(str(e)) from None
    finally:
        for lock in taken:
            lock.release()


def _run_args(args, kind: str, subs, *, build: Path) -> argparse.Namespace:
    """`grade`'s arguments for one batch: its cases (a check: the public ones only, and on a
    machine without a GPU the small CPU cases for Python, as `make check`), a build folder of
    its own, the build cache shared in the store."""
    check = kind == "check"
    python = all(s.kind is Kind.PYTHON for s in subs)
    return argparse.Namespace(
        command="grade", cases=args.cases, hidden=args.hidden, no_hidden=check, cpu=args.cpu,
        cpu_cases=config.CPU_CHECK_CASES if check and python else None, gpus=args.gpus,
        lanes=config.GPU_LANES, jobs=None, no_build_cache=False, calibration=False,
        policy=args.policy, roster=None, force=True, only=None, skipped=[], verbose=False,
        build_dir=build.resolve(), cache_root=(args.store / "build").resolve(),
        executor=args.executor, partition=args.partition, slurm_workers=args.slurm_workers,
        slurm_time=args.slurm_time, slurm_gpus_per_task=args.slurm_gpus_per_task,
        slurm_arg=args.slurm_arg)


def _tokens(args: argparse.Namespace) -> int:
    if args.reissue and not args.revoke:
        return _error("--reissue goes with --revoke FOLDER (the student whose token to replace)")
    if not args.revoke and not args.roster:
        return _error("give --roster roster.csv (a token for each student without one) or "
                      "--revoke FOLDER")
    try:
        store = Store(args.store)
        if args.revoke:
            token = revoke(store, args.revoke, reissue=args.reissue)
            print(f"revoked {args.revoke}'s token: it stops working now"
                  + (f"; their new one is in {args.store / TOKENS_CSV}" if token else ""))
            return 0
        done = issue(store, load_roster(args.roster))
    except (RosterError, TokenError, OSError) as e:
        return _error(str(e))
    print(f"{len(done.new)} new token(s), {len(done.kept)} kept: one line per student in "
          f"{args.store / TOKENS_CSV} (folder, token), readable by you only; mail each student "
          f"their own line, or post it through the LMS")
    if done.instructor_new:
        print(f"the instructor's token: {args.store / INSTRUCTOR_TOKEN}")
    return 0


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2

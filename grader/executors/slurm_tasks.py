"""What runs on the course's nodes, in a Slurm task: one array task grading its shard into the
shared results folder (run_task), and a student's check as one job (run_check). submitit pickles
these functions and what they get and return by module path: they stay top-level functions here,
importable on the node."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
from pathlib import Path

from grader.common import config
from grader.course.policy import POLICY_FILE, load_policy
from grader.course.results import write_json_atomic
from grader.course.runs import LockHeld, RunJournal, RunSession, admitted
from grader.course.submission import Submission
from grader.isolation.device import DeviceInfo, detect_gpus
from grader.isolation.sandbox import Sandbox, SandboxUnavailable, default_layout
from grader.problem import load_all_cases
from grader.report.progress import Progress
from grader.schedule.workers import grade_all
from grader.stages.context import GpuUnhealthy, gpu_records, grading_context, now


FOLDER = "slurm"            # in the results folder


# ---------------------------------------------------------------- the work of one task


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """What every task gets (pickled by submitit): the run's inputs and its token."""
    out: Path
    token: str
    subs: tuple[Submission, ...]
    baselines: tuple[str, ...]
    workers: int
    build_dir: Path
    cases: Path
    hidden: Path | None
    cpu: bool = False
    jobs: int | None = None
    build_cache: bool = True
    calibration: bool = False
    policy: Path | None = None
    force: bool = False
    only: tuple[str, ...] | None = None
    cache_root: Path | None = None   # the build cache's folder is in it (None: build_dir)

    def task_file(self, task: int) -> Path:
        return task_folder(self.out, self.token) / f"task-{task}.json"


@dataclasses.dataclass(frozen=True)
class TaskOutcome:
    """What a task returns (submitit pickles it back to the head)."""
    task: int
    host: str
    state: str          # 'finished', 'interrupted', 'stopped' or 'refused'
    message: str = ""


def task_folder(out: Path, token: str) -> Path:
    return Path(out) / FOLDER / f"run-{token}"


def shard(subs, workers: int, task: int) -> list:
    """Task `task`'s share: sorted by kind then id (CUDA builds spread evenly), dealt round-robin."""
    ordered = sorted(subs, key=lambda s: (s.kind.value, s.id, s.role.value))
    return ordered[task::workers]


class TaskJournal(RunJournal):
    """A task's own run file, for the head: its device, sandbox, roster (with keys) and progress.
    After each result it checks that the folder still admits its run, and stops the task if not."""

    def __init__(self, spec: WorkerSpec, task: int, run: dict):
        self.path, self.token = spec.task_file(task), spec.token
        super().__init__(spec.out, run)

    def plan(self, entries) -> None:
        self.run["actions"] = {e.id + "\0" + e.role: e.action for e in entries}
        self.run["why"] = {e.label: e.why for e in entries if e.action == "grade" and e.why}
        super().plan(entries)

    def record(self, how: str) -> None:
        super().record(how)
        if admitted(self.out_dir) != self.token:
            raise KeyboardInterrupt("the run this task serves has ended")

    def write(self) -> None:
        write_json_atomic(self.path, self.run)


def run_task(spec: WorkerSpec, task: int) -> TaskOutcome:
    """One array task, on its node: grade this task's shard into the shared results folder."""
    host = socket.gethostname()
    devices = detect_gpus(None, force_cpu=spec.cpu)   # the GPUs Slurm gave this task
    device = devices[0]
    cases = load_all_cases(spec.cases, spec.hidden)
    policy = load_policy(spec.policy or POLICY_FILE, required=spec.policy is not None)
    session = RunSession(spec.out, device=device, worker_of=spec.token,
                         gpus=devices if device.cuda else ())
    try:
        session.open()
    except LockHeld as e:
        return TaskOutcome(task, host, "refused", str(e))
    try:
        return _grade_shard(spec, task, devices=devices, cases=cases, policy=policy, host=host)
    finally:
        session.close()


def _grade_shard(spec: WorkerSpec, task: int, *, devices: list[DeviceInfo], cases, policy,
                 host: str) -> TaskOutcome:
    device = devices[0]
    gpus = [d for d in devices if d.cuda]   # one GPU worker each, as `grade --gpus` does
    try:
        sandbox = Sandbox.probe(**default_layout())
    except SandboxUnavailable as e:   # as a local run: nothing graded, the reason said
        return TaskOutcome(task, host, "stopped", str(e))
    if not sandbox.active:
        print(f"WARNING: {sandbox.describe()}", file=sys.stderr)
    limits = config.Limits.from_env()
    mine = shard(spec.subs, spec.workers, task)
    baselines = list(spec.baselines) if task == 0 and device.cuda else []
    run = dict(task=task, host=host, job=os.environ.get("SLURM_JOB_ID", ""),
               started_at=now(), finished_at=None, device=device.to_dict(),
               sandbox=sandbox.describe(), sandboxed=sandbox.active, limits=vars(limits),
               submissions=[s.id for s in mine], baselines=baselines, gpus=gpu_records(gpus))
    journal = TaskJournal(spec, task, run)
    ctx = grading_context(cases=cases, device=device, gpus=gpus, limits=limits,
                          out_dir=spec.out, build_dir=spec.build_dir,
                          progress=Progress(len(mine) + len(baselines)), sandbox=sandbox,
                          calibration=spec.calibration, policy=policy,
                          build_cache=_build_cache(spec, sandbox))
    state, message = "stopped", ""
    try:
        grade_all(mine, ctx, baselines=baselines, build_jobs=spec.jobs, force=spec.force,
                  only=set(spec.only) if spec.only is not None else None, journal=journal)
        state = "finished"
    except GpuUnhealthy as e:
        message = f"STOPPED: {e}"
    except KeyboardInterrupt as e:   # scancel, the head's cancel, or the run ended
        state, message = "interrupted", str(e)
        if message == "SIGTERM":
            message += " (scancel, the head's cancel, a time limit or a preemption)"
    finally:
        run.update(finished_at=now())
        journal.finish(state)
    return TaskOutcome(task, host, state, message)


def _build_cache(spec: WorkerSpec, sandbox: Sandbox):
    if not spec.build_cache:
        return None
    from grader.build.cache import FOLDER as CACHE_FOLDER, BuildCache
    return BuildCache((spec.cache_root or spec.build_dir) / CACHE_FOLDER, sandboxed=sandbox.active)


# ---------------------------------------------------------------- check on the course's nodes


@dataclasses.dataclass(frozen=True)
class CheckOutcome:
    """A `check` run on a node: its exit status and what it printed."""
    code: int
    stdout: str
    stderr: str


def run_check(argv: list[str], timeout_s: float) -> CheckOutcome:
    """On the node: `python -m grader check ...`, as a student would run it there."""
    try:
        proc = subprocess.run([sys.executable, "-m", "grader", *argv], cwd=config.REPO_ROOT,
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        return CheckOutcome(3, _text(e.stdout), _text(e.stderr) + f"\ncheck timed out after {timeout_s:.0f} s")
    return CheckOutcome(proc.returncode, proc.stdout, proc.stderr)


def _text(data) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")

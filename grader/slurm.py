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
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from . import config
from .cases import CaseFileError, largest, load_all_cases
from .device import DeviceInfo, detect, detect_gpus
from .pipeline import GpuUnhealthy, grade_all, gpu_records, grading_context, now
from .policy import POLICY_FILE, PolicyError, load_policy
from .progress import Progress
from .results import ResultUnreadable, load_result, path_for, read_results, write_json_atomic
from .baselines import BASELINES
from .runs import (WORKERS_FILE, LockHeld, RunJournal, RunSession, admitted, check_only,
                   previous_run_note)
from .sandbox import Sandbox, SandboxUnavailable, default_layout
from .submission import Role, Submission

FOLDER = "slurm"            # in the results folder
POLL_S = float(os.environ.get("GRADER_SLURM_POLL_S", "2"))
GONE_GRACE_S = 60           # a task out of the queue with no outcome yet: wait this long for it
STOP_WAIT_S = 120           # after a cancel: how long the head waits for the tasks to stop


class SlurmError(RuntimeError):
    """A problem the instructor fixes before anything is graded (one paragraph)."""


# ---------------------------------------------------------------- options


@dataclasses.dataclass(frozen=True)
class SlurmOptions:
    partition: str
    workers: int = 1
    time_min: int = 240
    gpus_per_task: int = 1
    extra: tuple[tuple[str, str], ...] = ()   # raw sbatch options (--slurm-arg KEY=VALUE)

    @classmethod
    def from_args(cls, args, n_subs: int) -> "SlurmOptions":
        """From the command line; SlurmError for a value that cannot work."""
        if not args.partition:
            raise SlurmError("--executor slurm needs --partition NAME (make grade EXECUTOR=slurm "
                             "PARTITION=NAME): the partition of the course's GPU nodes; `sinfo` "
                             "lists them")
        workers, time_min = args.slurm_workers or 1, args.slurm_time or 240
        if workers < 1 or time_min < 1 or (args.slurm_gpus_per_task or 0) < 0:
            raise SlurmError("--slurm-workers and --slurm-time must be at least 1, "
                             "--slurm-gpus-per-task at least 0")
        extra = []
        for item in args.slurm_arg or ():
            key, sep, value = item.partition("=")
            if not sep or not key.strip().lstrip("-"):
                raise SlurmError(f"--slurm-arg {item!r}: expected KEY=VALUE, an sbatch option "
                                 f"without its dashes, e.g. --slurm-arg cpus-per-task=8")
            extra.append((key.strip().lstrip("-"), value))
        gpus = args.slurm_gpus_per_task
        return cls(partition=args.partition, workers=max(1, min(workers, n_subs)),
                   time_min=time_min, gpus_per_task=(0 if args.cpu else 1) if gpus is None else gpus,
                   extra=tuple(extra))


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
    from .build_cache import FOLDER as CACHE_FOLDER, BuildCache
    return BuildCache(spec.build_dir / CACHE_FOLDER, sandboxed=sandbox.active)


# ---------------------------------------------------------------- submitting


def make_executor(out: Path, opts: SlurmOptions):
    """A submitit SlurmExecutor writing under <out>/slurm/jobs; SlurmError when this machine
    cannot submit (no submitit, no sbatch)."""
    try:
        import submitit
    except ImportError:
        raise SlurmError(f"--executor slurm needs the Python package submitit, which "
                         f"{sys.executable} cannot import: run `make env` (pyproject.toml lists "
                         f"it) or `{sys.executable} -m pip install submitit`") from None
    missing = [tool for tool in ("sbatch", "squeue", "scancel", "srun") if shutil.which(tool) is None]
    if missing:
        raise SlurmError(f"--executor slurm submits with Slurm's commands, and {', '.join(missing)} "
                         f"{'is' if len(missing) == 1 else 'are'} not on PATH here: run the grader "
                         f"on a machine of the cluster (a login node), or load Slurm's module first "
                         f"(`module load slurm`)")
    executor = submitit.SlurmExecutor(folder=Path(out) / FOLDER / "jobs", max_num_timeout=0)
    repo = config.REPO_ROOT
    params = dict(partition=opts.partition, time=opts.time_min, job_name="grader",
                  setup=[f"cd {_quote(repo)}",
                         f"export PYTHONPATH={_quote(repo)}${{PYTHONPATH:+:$PYTHONPATH}}",
                         # submitit imports pkg_resources, which warns in every log
                         "export PYTHONWARNINGS='ignore:pkg_resources is deprecated:UserWarning'"],
                  additional_parameters=dict(opts.extra))
    if opts.gpus_per_task:
        params["gpus_per_task"] = opts.gpus_per_task
    executor.update_parameters(**params)
    return executor


def _quote(path) -> str:
    import shlex
    return shlex.quote(str(path))


def submit(executor, spec: WorkerSpec, opts: SlurmOptions) -> list:
    """One array of opts.workers tasks (a plain job for one); SlurmError with sbatch's message."""
    try:
        return executor.map_array(run_task, [spec] * opts.workers, range(opts.workers))
    except Exception as e:   # submitit's FailedJobError carries sbatch's own words
        raise SlurmError(_refused(e, opts)) from None


def _refused(e: Exception, opts: SlurmOptions) -> str:
    said = " ".join(line.strip() for line in str(e).splitlines() if line.strip())[-800:]
    return (f"sbatch refused the job (partition {opts.partition!r}, {opts.workers} task(s), "
            f"{opts.time_min} min, {opts.gpus_per_task} GPU(s) per task): {said}. Check the "
            f"partition with `sinfo`, and its limits with `scontrol show partition "
            f"{opts.partition}`")


# ---------------------------------------------------------------- following the tasks


@dataclasses.dataclass
class TaskView:
    """The head's view of one task."""
    task: int
    job: object                  # submitit's SlurmJob
    state: str = "queued"        # queued, running, then finished / interrupted / stopped / refused / failed
    run: dict = dataclasses.field(default_factory=dict)   # its task file
    message: str = ""
    gone_since: float | None = None
    value: object = None         # what the job returned

    @property
    def over(self) -> bool:
        return self.state not in ("queued", "running")


def queue_states(job_id: str) -> dict[str, str] | None:
    """squeue's state of each task of the array `job_id` still in the queue ('12_3': 'RUNNING');
    None when squeue itself failed (the controller is busy: ask again later)."""
    try:
        out = subprocess.run(["squeue", "-h", "-r", "-j", job_id, "-o", "%i %T"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:   # an id the controller forgot (MinJobAge) is an error, not 'empty'
        return {} if "Invalid job id" in out.stderr else None
    return dict(line.split(None, 1) for line in out.stdout.splitlines() if " " in line)


def _read_task_file(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def update(view: TaskView, task_file: Path | None, queued: dict | None) -> bool:
    """Refresh one task's view (`task_file`: its own run file, if it writes one); True when it
    changed state."""
    before = view.state
    if task_file is not None:
        view.run = _read_task_file(task_file) or view.run
    if view.over:
        return False
    job = view.job
    if job.paths.result_pickle.exists():
        view.state, view.message, view.value = _outcome(job)
    elif queued is not None and job.job_id in queued:
        view.gone_since = None
        view.state = "running" if queued[job.job_id] in ("RUNNING", "COMPLETING") else "queued"
    elif queued is not None:   # left the queue: its outcome may take a moment on a shared disk
        view.gone_since = view.gone_since or time.monotonic()
        if time.monotonic() - view.gone_since > GONE_GRACE_S:
            view.state, view.message = "failed", ("it ended without an outcome: it crashed "
                                                  "(see its log), or was killed (scancel, node "
                                                  "failure, time limit)")
    return view.state != before


def _outcome(job) -> tuple[str, str, object]:
    """(state, message, what the job returned) of a job whose result pickle is there."""
    try:
        outcome = job.result()
    except Exception as e:
        lines = [line for line in str(e).splitlines() if line.strip()]
        return "failed", lines[-1] if lines else type(e).__name__, None
    if isinstance(outcome, TaskOutcome):
        return outcome.state, outcome.message, outcome
    return "finished", "", outcome


def log_tail(job, lines: int = 15) -> str:
    """The end of a task's stderr log, and where the log is."""
    path = job.paths.stderr
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    tail = "\n".join("    " + line for line in text[-lines:])
    return f"log: {path}\n{tail}"


class Follow:
    """The head's loop: poll the queue and the tasks' files, print each result as it lands."""

    def __init__(self, spec: WorkerSpec, jobs: list, progress: Progress, journal: RunJournal,
                 entries: list[dict]):
        self.spec, self.progress, self.journal, self.entries = spec, progress, journal, entries
        self.views = [TaskView(i, job) for i, job in enumerate(jobs)]
        self.array_id = str(jobs[0].job_id).split("_")[0]
        self.paths = {(e["id"], e["role"]): path_for(spec.out, e["id"], e["role"])
                      for e in entries}
        self.seen = {k: _mtime(p) for k, p in self.paths.items()}
        self.announced: set[int] = set()

    def poll(self, *, queue: bool = True) -> None:
        queued = queue_states(self.array_id) if queue else None
        self._landed()
        for view in self.views:
            if update(view, self.spec.task_file(view.task), queued):
                self._say(view)
            if view.run.get("actions") and view.task not in self.announced:
                self._planned(view)

    def wait(self) -> None:
        last_queue = 0.0
        while not all(v.over for v in self.views):
            ask = time.monotonic() - last_queue >= max(POLL_S, 10)
            self.poll(queue=ask)
            if ask:
                last_queue = time.monotonic()
            time.sleep(POLL_S)
        self.poll(queue=False)

    def cancel(self) -> None:
        """Cancel every task of the array; wait (bounded) for them to stop and write what they
        finished; a second Ctrl-C stops the wait."""
        subprocess.run(["scancel", self.array_id], capture_output=True, timeout=60)
        self.progress.note(f"cancelled job {self.array_id}; waiting up to {STOP_WAIT_S} s for its "
                           f"tasks to stop (Ctrl-C again: stop waiting)")
        deadline = time.monotonic() + STOP_WAIT_S
        try:
            while time.monotonic() < deadline:
                self.poll()
                queued = queue_states(self.array_id)
                if queued == {} or all(v.over for v in self.views):
                    break
                time.sleep(POLL_S)
        except KeyboardInterrupt:
            pass
        self.poll(queue=False)

    def _say(self, view: TaskView) -> None:
        host = f", {view.run['host']}" if view.run.get("host") else ""
        text = f"slurm task {view.task} (job {view.job.job_id}{host}): {view.state}"
        if view.message and view.state != "finished":
            text += f": {view.message}"
        if view.over and view.state != "finished":
            text += "\n  " + log_tail(view.job)
        self.progress.note(text)

    def _planned(self, view: TaskView) -> None:
        self.announced.add(view.task)
        merge_tasks(self.journal.run, self.spec.out, self.entries, self.views)
        self.journal.write()   # the keys as planned: a killed head's run file reads right
        actions = list(view.run["actions"].values())
        sandbox = "" if view.run.get("sandboxed") else f"; WARNING: {view.run.get('sandbox')}"
        device = (view.run.get("device") or {}).get("name", "?")
        self.progress.note(f"slurm task {view.task} started on {view.run.get('host', '?')} "
                           f"({device}): {actions.count('grade')} to grade, {actions.count('skip')} "
                           f"unchanged{sandbox}")
        reasons: dict[str, list[str]] = {}
        for label, why in (view.run.get("why") or {}).items():
            reasons.setdefault(why, []).append(label)
        for why, labels in reasons.items():   # as a local run says it (pipeline._announce)
            shown = ", ".join(labels[:5]) + (f" and {len(labels) - 5} more" if len(labels) > 5 else "")
            self.progress.note(f"slurm task {view.task}: regrading {shown}: {why}")
        for key, action in view.run["actions"].items():
            if action in ("skip", "keep"):
                id, role = key.split("\0")
                self.progress.skipped(_load(self.paths.get((id, role))), id, kept=action == "keep")

    def _landed(self) -> None:
        for key, path in self.paths.items():
            mtime = _mtime(path)
            if mtime is not None and mtime != self.seen[key]:
                self.seen[key] = mtime
                result = _load(path)
                if result is not None:
                    self.progress.done(result)


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def _load(path: Path | None):
    try:
        return load_result(path) if path is not None else None
    except ResultUnreadable:
        return None


# ---------------------------------------------------------------- the head


def head_entries(subs, baselines: list[str]) -> list[dict]:
    """The run's roster as the head knows it, before any task has planned (no keys yet)."""
    entries = [dict(id=name, role="baseline", kind="builtin", label=BASELINES[name].label)
               for name in baselines]
    entries += [dict(id=s.id, role=s.role.value, kind=s.kind.value,
                     label="Reference solution" if s.role is Role.BASELINE else s.id) for s in subs]
    return entries


NOT_PLANNED = "not-planned"   # a roster key no result has: shown as not graded by this run


def merge_tasks(run: dict, out: Path, entries: list[dict], views: list[TaskView]) -> None:
    """The run file's roster, device and sandbox from what the tasks planned: each entry keeps the
    key of the task that planned it; an entry no task planned has none that any result matches."""
    planned = {}
    for view in views:
        for e in view.run.get("roster") or ():
            planned[(e["id"], e["role"])] = e
    devices = [v.run["device"] for v in views if v.run.get("device")]
    cuda = any(d.get("cuda") for d in devices)
    roster = []
    for e in entries:
        if (e["id"], e["role"]) in planned:
            roster.append(planned[(e["id"], e["role"])])
        elif e["kind"] == "builtin" and devices and not cuda:
            continue   # PyTorch baselines are timed on a GPU only, as in a local run
        else:
            rel = path_for(out, e["id"], e["role"]).relative_to(out)
            roster.append({**e, "result": str(rel), "key": NOT_PLANNED})
    run["roster"] = roster
    if devices:
        first = next(v.run for v in views if v.run.get("device"))
        run.update(device=first["device"], sandbox=first.get("sandbox"),
                   sandboxed=all(v.run.get("sandboxed") for v in views if v.run.get("device")),
                   limits=first.get("limits", run.get("limits")), gpus=first.get("gpus", []))
        if not cuda:
            run["baselines"] = []
        names = sorted({d.get("name") for d in devices})
        if len(names) > 1:
            run["devices"] = names   # tasks on different GPUs: their rows are not comparable
    counts = [v.run.get("progress") or {} for v in views]
    run["progress"] = {how: sum(c.get(how, 0) for c in counts) for how in ("graded", "skipped", "kept")}
    run["progress"]["total"] = len(roster)
    run["slurm"] = [dict(task=v.task, job=str(v.job.job_id), host=v.run.get("host"),
                         state=v.state, message=v.message) for v in views]


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
    _report(out, args, results, run, policy)
    return code


def _worker_spec(args, *, out: Path, token: str, subs, baselines, workers: int) -> WorkerSpec:
    """What every task gets: this run's inputs, every path absolute."""
    return WorkerSpec(out=out.resolve(), token=token, subs=tuple(subs), baselines=tuple(baselines),
                      workers=workers, build_dir=args.build_dir.resolve(),
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


def _report(out: Path, args, results, run: dict, policy) -> None:
    """The pages and exports, and the text table, exactly as a local run writes them."""
    from .__main__ import where_reports_are
    from .report import terminal_table, write_reports
    paths = write_reports(out, archive=True, roster=getattr(args, "roster", None),
                          results=results, policy=policy)
    print(terminal_table(out, results, run))   # with the instructors' review decisions applied
    print(where_reports_are(paths, out))


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


def check_argv(args, out: Path) -> list[str]:
    """The `check` command line for the node, every path absolute, without the Slurm options."""
    argv = ["check", str(args.path.resolve()), "--out", str(out.resolve()),
            "--build-dir", str(args.build_dir.resolve()), "--cases", str(args.cases.resolve())]
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

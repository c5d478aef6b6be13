"""Slurm through submitit, for the head: the sbatch options (SlurmOptions), an executor that
submits with them, the array of tasks submitted, and each task's state as squeue and submitit's
result pickle tell it (TaskView, update). What a task runs is slurm_tasks.py's."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from grader.common import config
from grader.executors.slurm_tasks import FOLDER, TaskOutcome, WorkerSpec, run_task


POLL_S = float(os.environ.get("GRADER_SLURM_POLL_S", "2"))
GONE_GRACE_S = 60           # a task out of the queue with no outcome yet: wait this long for it


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


# ---------------------------------------------------------------- a task's state


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

"""The head following its tasks: the loop that polls the queue and the tasks' files and prints
each result as it lands (Follow), and the run file's roster, device and sandbox merged from what
the tasks planned (merge_tasks)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from grader.course.results import ResultUnreadable, load_result, path_for
from grader.course.runs import RunJournal
from grader.course.submission import Role
from grader.executors.slurm_jobs import POLL_S, TaskView, log_tail, queue_states, update
from grader.executors.slurm_tasks import WorkerSpec
from grader.problem import BASELINES
from grader.report.progress import Progress


STOP_WAIT_S = 120           # after a cancel: how long the head waits for the tasks to stop


# ---------------------------------------------------------------- following the tasks


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
        for why, labels in reasons.items():   # as a local run says it (workers._announce)
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


# ---------------------------------------------------------------- the run file


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

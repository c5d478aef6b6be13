"""Starting the trusted harness (grader/trusted/harness.py), which starts and drives a subject: a
harness for one mode (run_harness), warm harnesses started before their work is known
(WarmHarness, take_harness), one harness for a run and its time stage (Stages), a time stage on a
subject of its own (TimeSubject), and a run begun before its turn (Prepared)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

from grader.common import config
from grader.isolation.cpus import CpuSplit
from grader.isolation.procs import run_limited, spawn_capped
from grader.isolation.quota import QUOTA
from grader.isolation.tree import end_processes, process_tree, started_at
from grader.stages.context import GradeContext
from grader.stages.folders import SUBJECT, jit_env
from grader.stages.turns import PerThread
import contextlib
import dataclasses
from grader.course.submission import Submission
from grader.course.verdicts import ProtocolCost


def harness_said(output: str) -> str:
    """A note's tail: the last lines of a harness that ended with no record, if any."""
    tail = "\n".join(output.strip().splitlines()[-15:])
    return f"; its harness said:\n{tail}" if tail else ""


class NotStarted(Exception):
    """A run begun early (Lookahead) whose harness ended on its turn without a record: it gave
    up (subject_start._give_up: its subject was gone before loading anything) or failed. Nothing of the
    submission's ran to a result: grade_submission grades it anew, in new folders."""

    def __init__(self, output: str):
        super().__init__("a run begun early did not start")
        self.output = output


HARNESS = [sys.executable, "-m", "grader.trusted.harness", "--spec"]


def harness_spec(mode: str, target: dict, ctx: GradeContext, work: Path, *, folder: list[Path],
                 deadline_s: float, jit: Path | None = None, **fields) -> tuple[dict, Path]:
    """What grader/trusted/harness.py (trusted: it never imports the submission) is to do in `mode`, and
    the file it is read from; the subject runs in the sandbox, read-only on `folder` and writable
    on its JIT cache `jit`."""
    cwd = folder[0] if folder else SUBJECT.parent
    spec = dict(mode=mode, device=ctx.device_name, target=target,
                subject_cmd=ctx.sandbox.wrap([sys.executable, str(SUBJECT)], readonly=folder,
                                             writable=[jit] if jit else [],
                                             # a student's code sees no cuDNN engine: a forged
                                             # report can claim no faster library (issue 30)
                                             hide_libraries=target.get("kind") in ("cuda", "python")),
                env=jit_env(ctx.env, jit) if jit else None,
                cwd=str(cwd), head_bytes=ctx.limits.output_head_bytes,
                tail_bytes=ctx.limits.output_tail_bytes,
                file_bytes=int(ctx.limits.file_gb * (1 << 30)), deadline_s=deadline_s,
                out_dir=str(work), result=str(work / f"{mode}.json"),
                jit=str(jit) if jit else None, **fields)
    return spec, work / f"{mode}_spec.json"


def harness_record(result: Path, harness_output: str) -> tuple[dict | None, str]:
    """The harness's record (None if the harness itself failed) and the text for the log."""
    if not result.exists():
        return None, harness_output
    record = json.loads(result.read_text())
    return record, record.get("output", "") + (f"\n[grader harness]\n{harness_output}"
                                               if harness_output.strip() else "")


def run_harness(mode: str, target: dict, ctx: GradeContext, work: Path, *, folder: list[Path],
                deadline_s: float, jit: Path | None = None, **fields) -> tuple[dict | None, str]:
    """Run grader/trusted/harness.py in `mode` (harness_spec) to its end: its record and log text."""
    spec, spec_path = harness_spec(mode, target, ctx, work, folder=folder, deadline_s=deadline_s,
                                   jit=jit, **fields)
    spec_path.write_text(json.dumps(spec))
    proc = run_limited([*HARNESS, str(spec_path)], timeout_s=deadline_s + 300, env=ctx.env,
                       cwd=config.REPO_ROOT, cpus=ctx.cpus.gpu,
                       **QUOTA.hooks(jit, spare_root=True))   # its subject writes there
    return harness_record(Path(spec["result"]), proc.output)


HARNESS_WAITING = [sys.executable, "-m", "grader.trusted.harness", "--wait"]


class WarmHarness:
    """A harness process started before its work is known (issue 13: its Python start and
    imports leave the GPU's critical path). It imports torch and the grader, touches no GPU and
    waits on its control pipe, on the builds' CPUs, off the GPU stages' (a timed call's harness
    and subject need theirs at once); begin() gives it a spec, and it does what a harness started
    with --spec would, on the GPU stages' CPUs (subject_start.take_cpus; a run begun early moves on its
    turn). The same pipes then carry run_then_time's "ran", "time" and "stop". Always closed:
    close() ends it (its subject with it) on every path."""

    def __init__(self, env: dict | None, cpus: CpuSplit | None):
        ready_r, ready_w = os.pipe()
        decide_r, decide_w = os.pipe()
        try:
            self.proc, self.reader = spawn_capped(
                [*HARNESS_WAITING, str(ready_w), str(decide_r)], env=env, cwd=config.REPO_ROOT,
                pass_fds=(ready_w, decide_r), cpus=cpus.build if cpus else None)
        except BaseException:
            os.close(ready_r)
            os.close(decide_w)
            raise
        finally:
            os.close(ready_w)
            os.close(decide_r)
        self.ready_r, self.decide_w = ready_r, decide_w
        self.key = _harness_key(env, cpus)
        self.closed = False
        self.jit: str | None = None   # its spec's JIT cache folder (grader/isolation/quota.py)
        self.left: set[int] = set()   # processes still running after close (end_processes)

    def begin(self, spec: dict, spec_path: Path, cpus: CpuSplit | None = None) -> None:
        """Its work: `spec` (harness_spec), written to `spec_path`, done on `cpus.gpu`. "spawned"
        is now: the run stage's "harness" part is how long a warm harness took to take it up."""
        where = dict(cpus=list(cpus.gpu)) if cpus else {}
        spec_path.write_text(json.dumps(dict(spec, spawned=time.monotonic(), **where)))
        self.jit = spec.get("jit")
        QUOTA.attach(self.jit, self.proc.pid, spare_root=True)   # its subject writes there
        self.say(f"spec {spec_path}\n".encode())

    def said(self, timeout_s: float) -> bytes:
        """What it wrote on its ready pipe within timeout_s (b"" if nothing, or it died)."""
        ready, _, _ = select.select([self.ready_r], [], [], timeout_s)
        return os.read(self.ready_r, 16) if ready else b""

    def prepared(self, timeout_s: float) -> bool:
        """Whether it says "prepared" (spec "prepare") within timeout_s; if not (it died, or
        is still preparing), it is closed at once."""
        ready = self.said(timeout_s).startswith(b"prepared")
        if not ready:
            self.close(wait_s=0)
        return ready

    def wait(self, timeout_s: float) -> None:
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass

    def close(self, wait_s: float = 30) -> None:
        """Let it go: "stop", up to wait_s for it to end its subject and exit, then its process
        group killed (at once with wait_s 0: one that is not reading its control pipe)."""
        if self.closed:
            return
        self.closed = True
        # its subject's processes too, and the orphans it adopted, before any ends
        tree = {pid: started_at(pid) for pid in process_tree(self.proc.pid)}
        self.say(b"stop\n")
        if wait_s:
            self.wait(wait_s)   # the harness ends its subject (Link.close) and exits
        # gone, each of them, before this returns (grader/schedule/gate.py's invariant); `left`: any not
        self.left = end_processes(self.proc, tree, timeout_s=60)
        QUOTA.detach(self.jit, self.proc.pid)
        self.reader.join(timeout=10)
        for fd in (self.ready_r, self.decide_w):
            os.close(fd)

    def say(self, word: bytes) -> None:
        try:
            os.write(self.decide_w, word)
        except OSError:   # the harness is gone: what it left says why
            pass


def _harness_key(env: dict | None, cpus: CpuSplit | None) -> tuple:
    return (tuple(sorted(env.items())) if env else None, cpus)


class _Spare:
    """A GPU worker's next harness, started when it took the last one (keep_warm). One per
    thread (_SPARE: PerThread, not threading.local: it holds a process)."""

    def __init__(self):
        self.keep = False
        self.harness: WarmHarness | None = None


def keep_spares() -> None:
    """From now on the calling thread (a GPU worker's lane) keeps a spare harness started: each
    take_harness starts the next one while the one it gave runs."""
    _SPARE.keep = True


def drop_spares() -> None:
    """The calling thread keeps no spare from here; the one it held is closed."""
    spare = _SPARE.harness
    _SPARE.forget()   # keep off, and no spare held, from here
    if spare is not None:
        spare.close()


def take_harness(env: dict | None, cpus: CpuSplit | None, *, spare: bool = True) -> WarmHarness:
    """A harness for the calling thread's next run stage. In a GPU worker (keep_warm), the one
    started when the worker took its last, its imports done while that one ran, if it has the
    same environment and CPUs and is alive; and another is started now for the next, unless not
    `spare` (a run begun early: the one after it is begun early too, Lookahead). Elsewhere (a
    single check, the tests) a new one, and none kept."""
    got, _SPARE.harness = _SPARE.harness, None
    if got is not None and (got.key != _harness_key(env, cpus) or got.proc.poll() is not None):
        got.close()
        got = None
    if got is None:
        got = WarmHarness(env, cpus)
    if _SPARE.keep and spare:
        _SPARE.harness = WarmHarness(env, cpus)
    return got


def turn_word(protocol: ProtocolCost) -> bytes:
    """What a prepared harness is told on its turn (subject_start.start_prepared): run, with the
    protocol's cost its time stage subtracts. A worker's first runs are begun while its GPU's
    protocol is being calibrated (schedule/workers.py), so their specs, written then, cannot
    hold it; the harness takes this one in place of the spec's."""
    return b"run " + json.dumps(dict(protocol=protocol.to_dict())).encode() + b"\n"


class Stages:
    """One harness process, and so one subject, for a submission's run and time stages
    (harness.run_then_time; issue 13: the time stage starts no second harness or subject and
    imports and compiles nothing again). The run stage begins it on a warm harness
    (take_harness); after the check the pipeline either times the largest case on that subject
    (time) or lets it go (close). Always closed: close() on every path, including after time()."""

    def __init__(self, spec: dict, spec_path: Path, *, env: dict, cpus: CpuSplit | None,
                 spare: bool = True):
        self.results = Path(spec["result"]), Path(spec["time"]["result"])
        self.time_s = spec["time"]["deadline_s"] + 300
        self.harness = take_harness(env, cpus, spare=spare)
        try:
            self.harness.begin(spec, spec_path, cpus)
        except BaseException:
            self.harness.close()
            raise

    def go(self, protocol: ProtocolCost) -> None:
        """A prepared run's turn (spec "prepare", Prepared.settle): load the submission, run;
        its time stage subtracts `protocol` (turn_word)."""
        self.harness.say(turn_word(protocol))

    def ran(self, timeout_s: float) -> tuple[dict | None, str]:
        """The run stage's record and log text, once the harness says it has them (or has died,
        or timeout_s passed: then it is killed)."""
        said = self.harness.said(timeout_s)
        if not said.startswith(b"ran"):
            self.close()
        return harness_record(self.results[0], "" if said else self.harness.reader.text())

    def time(self) -> tuple[dict | None, str]:
        """The time stage on the run's subject, to its end: its record and log text."""
        self.time_calls()
        return self.time_record()

    def time_calls(self) -> bool:
        """The time stage begun, until its timed calls are over: whether the harness said so
        ("timed": its subject is gone and only its trusted work, the statistics and the spot
        checks, is left: harness.run_then_time); False when it ended (or hung) before."""
        self.time_deadline = time.monotonic() + self.time_s
        self.harness.say(b"time\n")
        return self.harness.said(self.time_s).startswith(b"timed")

    def time_record(self) -> tuple[dict | None, str]:
        """After time_calls: the time stage to its end (killed at its limit), its record and log
        text."""
        self.harness.wait(max(0.0, self.time_deadline - time.monotonic()))
        self.close()
        return harness_record(self.results[1], self.harness.reader.text())

    def close(self, wait_s: float = 30) -> None:
        self.harness.close(wait_s)


class TimeSubject:
    """A submission's time stage on a subject of its own (time_stage.time_prepared), for when run
    stages share the GPU (gate.py): begun with its run stage or before it (Lookahead), its harness
    and subject start CUDA and the profiler on the builds' CPUs and wait; on its turn, with the
    GPU held alone, the submission is loaded from its JIT cache and timed. Its run stage's
    subject, which ran beside other submissions' code, is gone by then. Always closed."""

    def __init__(self, spec: dict, spec_path: Path, *, env: dict, cpus: CpuSplit | None,
                 health_checks: int = 0):
        self.result = Path(spec["result"])
        self.time_s = spec["deadline_s"] + 300
        self.ready: bool | None = None
        self.health_checks = health_checks   # its GPU's count as it was begun (GpuGate)
        self.harness = WarmHarness(env, cpus)
        try:
            self.harness.begin(spec, spec_path, cpus)
        except BaseException:
            self.harness.close(wait_s=0)
            raise

    def settle(self, timeout_s: float = config.PREPARE_S) -> bool:
        """Wait until its harness says "prepared" (or has died, or timeout_s passed: then it is
        killed)."""
        if self.ready is None:
            self.ready = self.harness.prepared(timeout_s)
        return self.ready

    def time(self, protocol: ProtocolCost) -> tuple[dict | None, str]:
        """The time stage, to its end, `protocol` subtracted (turn_word): its record (None when
        its subject never got to its turn) and the log text."""
        if self.settle():
            self.harness.say(turn_word(protocol))
            self.harness.wait(self.time_s)
        self.close()
        return harness_record(self.result, self.harness.reader.text())

    def close(self) -> None:
        self.harness.close(wait_s=30 if self.ready else 0)


def run_once(spec: dict, spec_path: Path, *, env: dict, cpus: CpuSplit | None
             ) -> tuple[dict | None, str]:
    """A harness's run of `spec` to its end, on a warm harness (take_harness): its record and
    log text; killed at the spec's deadline plus 300 s."""
    harness = take_harness(env, cpus)
    try:
        harness.begin(spec, spec_path, cpus)
        harness.wait(spec["deadline_s"] + 300)
    finally:
        harness.close()
    return harness_record(Path(spec["result"]), harness.reader.text())


_SPARE = PerThread(_Spare)


@dataclasses.dataclass
class Prepared:
    """A submission's run stage begun before its turn: its work and JIT folders (`folders` owns
    them), and Stages whose harness has its spec ("prepare"), its buffers and a subject that has
    started CUDA and its profiler and waits to load the submission (subject_start.start_prepared)."""
    sub: Submission
    work: Path
    jit: Path | None
    stages: "Stages"
    folders: contextlib.ExitStack
    ready: bool | None = None   # None until settled: prepared, or not (then closed)
    timer: TimeSubject | None = None   # its time stage's subject, when run stages share the GPU
    health_checks: int = 0   # its GPU's gate's count when it was begun (GpuGate.health_check)

    def settle(self, timeout_s: float = config.PREPARE_S) -> bool:
        """Wait until its harness says "prepared" (or has died, or timeout_s passed: then it is
        closed). Its GPU work (CUDA's start, the profiler's) is over once this returns."""
        if self.ready is None:
            self.ready = self.stages.harness.prepared(timeout_s)
        return self.ready

    def close(self) -> None:
        """Its processes and folders gone; one still preparing (not reading its control pipe) is
        killed at once."""
        self.stages.close(wait_s=30 if self.ready else 0)
        if self.timer is not None:
            self.timer.close()
        self.folders.close()

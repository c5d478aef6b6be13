"""A course's grading run (grade_all, CourseRun): builds in parallel on the CPU cores, then on
each GPU a worker whose lanes take the builds as they finish and grade each submission's stages
(grader/stages/grade.py): run and check stages of up to config.GPU_LANES submissions at once,
every time stage alone (grader/schedule/gate.py); one result file each, written the moment it is
known."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import errno
import itertools
import threading
import time
import traceback
from collections import deque

from grader.build.ahead import compile_ahead
from grader.build.stage import build_submission, machine_load
from grader.common import config
from grader.common.status import Status
from grader.course.results import SubmissionResult, write_result
from grader.course.runs import RunJournal, plan_run
from grader.course.submission import Kind, Submission, read_sources
from grader.course.verdicts import BuildResult
from grader.isolation.cpus import default_build_jobs, gpu_worker, set_gpu_workers
from grader.isolation.device import device_minor
from grader.isolation.procs import Cancelled, cancel_all
from grader.report.progress import Progress
from grader.schedule.gate import BuildThrottle, GpuGate
from grader.schedule.jobs import Jobs
from grader.schedule.behind import checks_behind, lane_behind
from grader.schedule.lookahead import first_turn, keep_warm, take_ahead
from grader.stages.ahead import early
from grader.stages.behind import Left, behind
from grader.stages.baseline import grade_baseline
from grader.stages.context import GpuUnhealthy, GradeContext, now, student_check
from grader.stages.folders import label_of
from grader.stages.grade import grade_submission
from grader.stages.judge import audit_build, source_verdict
from grader.stages.run import overloaded
from grader.stages.time import calibrate_protocol
from grader.stages.turns import alone


def worker_contexts(ctx: GradeContext) -> list[GradeContext]:
    """One context per GPU worker: its own device (name, UUID, architecture, L2), slot (its CPUs,
    cpus.split_cpus), environment (its children's CUDA sees only its GPU) and sandbox (only its
    GPU's device node: a submission cannot open another's). One GPU, or none: one worker."""
    devices = ctx.gpus if len(ctx.gpus) > 1 else (ctx.device,)
    workers = []
    for slot, device in enumerate(devices):
        minor = device_minor(device.uuid) if device.cuda and device.uuid else None
        if device.cuda and minor is None and len(devices) > 1:
            ctx.progress.note(f"{device.label}: its device node (/dev/nvidiaN) was not found; "
                              f"its submissions' processes can open every GPU's node")
        lanes = ctx.lanes if device.cuda else 1
        workers.append(dataclasses.replace(ctx, device=device, slot=slot, lanes=lanes,
                                           gate=GpuGate() if lanes > 1 else None,
                                           sandbox=ctx.sandbox.for_gpu(minor),
                                           progress=ctx.progress if len(devices) == 1
                                           else ctx.progress.on(device.label)))
    return workers


def build_throttle(build_jobs: int, ctx: GradeContext, waiting) -> BuildThrottle:
    """How many of the `build_jobs` builds compile at once (gate.BuildThrottle): a share of them
    (Limits.build_yield_share) while the GPU workers have config.BUILDS_YIELD_AHEAD jobs waiting,
    on a GPU machine; all of them without a GPU (nothing there is timed)."""
    share = ctx.limits.build_yield_share if ctx.device.cuda else 1.0
    low = max(1, int(build_jobs * share))
    return BuildThrottle(build_jobs, low, config.BUILDS_YIELD_AHEAD, waiting)


def grade_all(subs: list[Submission], ctx: GradeContext, *, baselines: list[str],
              build_jobs: int | None = None, force: bool = False, only: set[str] | None = None,
              journal: RunJournal | None = None) -> list[SubmissionResult]:
    """Builds run `build_jobs` at a time (default: as many as the build CPUs and memory allow,
    cpus.default_build_jobs); the GPU stages run on one GPU worker per GPU of
    `ctx.gpus` (one worker when it has at most one), each one submission at a time, taking the
    builds in the order they finish, on CPUs the builds do not use (GradeContext.cpus). Each
    worker calibrates the protocol on its GPU and times the PyTorch baselines there while the
    first builds compile; the reference solution is graded on every GPU too. Baselines on the
    first GPU keep their result files; on another, under baselines/gpu<index>/.

    A submission or baseline whose result on disk has this run's key (grader/course/runs.py) is
    skipped, unless `force`; with `only`, those ids are graded and the others keep what they
    have. `journal` (the run file) learns the roster and every result as it lands. Ctrl-C
    (KeyboardInterrupt) or a GPU failure cancels the queued builds and kills every running
    child of every worker before it propagates; what was finished is on disk. Returns the
    results graded."""
    run = CourseRun(subs, ctx, baselines=baselines, force=force, only=only, journal=journal)
    return run.grade(build_jobs)


class CourseRun:
    """One grading run of a course (grade_all): its plan, the build pool feeding the GPU workers'
    queue (jobs.Jobs), one worker thread per GPU with its lanes, and the results as they land."""

    def __init__(self, subs: list[Submission], ctx: GradeContext, *, baselines: list[str],
                 force: bool, only: set[str] | None, journal: RunJournal | None):
        self.ctx, self.journal = ctx, journal
        self.workers = worker_contexts(ctx)
        self.slot_of = {w.gpu_tag: k for k, w in enumerate(self.workers)}
        self.results: list[SubmissionResult] = []
        self.entries = entries = plan_run(subs, baselines, ctx, force=force, only=only,
                                          gpu_copies=tuple(w.gpu_tag for w in self.workers[1:]))
        _pin_baselines(entries, self.workers, self.slot_of)
        self.by_sub: dict[int, list] = {}
        for e in entries:
            if e.sub is not None:
                self.by_sub.setdefault(id(e.sub), []).append(e)
        if journal is not None:
            journal.plan(entries)
        if len(entries) != getattr(ctx.progress, "total", len(entries)):
            ctx.progress.set_total(len(entries))   # each baseline once per GPU
        _announce(entries, ctx.progress, only=only)
        self.lock = threading.Lock()
        self.halted = threading.Event()   # the run stops: no result is written from here
        for entry in entries:
            if entry.action != "grade":
                ctx.progress.skipped(entry.existing, entry.id, kept=entry.action == "keep")
                if journal is not None:
                    journal.record("skipped" if entry.action == "skip" else "kept")
        self.graded = [e for e in entries if e.action == "grade"]
        self.to_build = build_order(list({id(e.sub): e.sub for e in self.graded
                                          if e.sub is not None}.values()))
        # Each folder's sources, read before any of its code runs (own kernel names).
        self.sources = {id(s): read_sources(s.path) if s.kind is not Kind.INVALID else ""
                        for s in self.to_build}
        self.jobs = Jobs(len(self.workers))
        self.jobs.pending = len(self.to_build)
        self.jobs.put([(self.slot_of[e.gpu], ("baseline", e, None, None))
                       for e in self.graded if e.sub is None])
        self.reused = len(self.graded) < len(entries)   # some results of this run are kept: their cost
        self.errors: list[BaseException] = []
        self.throttle: BuildThrottle | None = None
        self.pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.first_left = len(self.to_build)   # builds of the first round not ended yet
        self.again: list[Submission] = []      # to build again once the load falls (retry_round)
        self.later: list = []                  # jobs to grade again once the load falls (again_later)
        self.graded_again: set[int] = set()

    # ------------------------------------------------------------ results

    def record(self, result: SubmissionResult, entry, worker: GradeContext | None, *,
               stopped: bool = False) -> None:
        """Write a result; `worker`: the one whose GPU graded it. Nothing is written once the
        run stops (its children were killed: what they left is no verdict), unless `stopped`
        (a verdict that needed no child: a failed build)."""
        result = dataclasses.replace(result, key=entry.key,
                                     gpu=worker.gpu_ref if worker is not None else None)
        with self.lock:
            if self.halted.is_set() and not stopped:
                return
            write_result(self.ctx.out_dir, result, path=entry.path)
            self.results.append(result)
            (worker or self.ctx).progress.done(result)
            if self.journal is not None:
                self.journal.record("graded")

    # ------------------------------------------------------------ builds, on the CPU cores

    def build(self, sub: Submission) -> BuildResult:
        ctx = self.ctx
        ctx.progress.stage(sub.id, "build")
        if not ctx.calibration:   # decided from the source alone: nothing of it is built or run
            flagged = source_verdict(sub, self.sources[id(sub)])
            if flagged:
                return BuildResult(Status.FLAGGED, "none", 0.0, message=flagged)
        build_dir = ctx.build_dir / sub.build_namespace / sub.module_name
        log_path = ctx.out_dir / "logs" / f"{sub.id}.build.log"
        with self.throttle.turn():
            built = build_submission(sub, build_dir=build_dir, device=ctx.device,
                                     limits=ctx.limits, sandbox=ctx.sandbox, cache=ctx.build_cache,
                                     log_path=log_path, student_check=student_check(ctx, sub))
            if ctx.calibration:
                return built
            # its Triton kernels compiled here, off the GPU, rather than in its turn on the GPU
            built = compile_ahead(sub, built, build_dir=build_dir, device=ctx.device,
                                  limits=ctx.limits, sandbox=ctx.sandbox, cases=list(ctx.cases),
                                  log_path=log_path)
        return audit_build(sub, built, build_dir, self.sources[id(sub)])

    def built(self, sub: Submission, future: concurrent.futures.Future, *,
              again: bool = False) -> None:
        """A build finished: its jobs go to the workers (a student's to any, the solution's
        each to its own GPU). One the overloaded machine failed is built again later in the run
        (retry_round), its jobs still pending; `again`: that second build."""
        queued, finished = [], True
        try:
            if self.jobs.stopped or future.cancelled():
                return
            try:
                build_result = future.result()
            except Exception as e:   # a grader bug must not stop the other submissions
                build_result = BuildResult(Status.BUILD_ERROR, "none", 0.0,
                                           message=f"grader error while building: {e!r}")
            if not again and build_result.under_load:
                with self.lock:
                    self.again.append(sub)
                finished = False
                return
            queued = [(self.slot_of[e.gpu] if e.role == "baseline" else None,
                       ("submission", e, sub, build_result))
                      for e in self.by_sub[id(sub)] if e.action == "grade"]
        finally:
            self.jobs.put(queued, built=finished)
            if not again:
                self.first_round_ended()

    def first_round_ended(self) -> None:
        """One build of the first round ended; after the last, the ones to build again start."""
        with self.lock:
            self.first_left -= 1
            start = self.first_left == 0 and bool(self.again)
        if start:
            try:
                self.pool.submit(self.retry_round)
            except RuntimeError:   # the pool is shut: the run is stopping
                pass

    def retry_round(self) -> None:
        """The builds that timed out twice on an overloaded machine (BuildResult.under_load),
        built once more after every other build of the run, once the load per core has fallen
        under config.BUILD_RETRY_CALM (or after config.BUILD_RETRY_WAIT_S): what they get then
        is their verdict, an environment_error again only if the machine is still overloaded."""
        subs = list(self.again)
        self.ctx.progress.note(
            f"building {len(subs)} again that timed out while the machine was overloaded "
            f"({', '.join(s.id for s in subs[:5])}{' ...' if len(subs) > 5 else ''}): first "
            f"waiting up to {config.BUILD_RETRY_WAIT_S:.0f} s for the load to fall")
        if not self.calm():
            return
        for s in subs:
            try:
                self.pool.submit(self.build, s).add_done_callback(
                    lambda f, s=s: self.built(s, f, again=True))
            except RuntimeError:   # the pool is shut: the run is stopping
                return

    # ------------------------------------------------------------ GPU workers

    def work(self, slot: int, worker: GradeContext) -> None:
        """GPU `slot`'s worker: the protocol calibrated on it while its lanes (worker.lanes
        threads, this one among them) begin their first runs (first_turn), then the lanes taking
        jobs, their run stages sharing the GPU and their time stages one at a time (gate.py); one
        lane grades as before lanes."""
        try:
            calibrated = self.calibrating(slot, worker)
            lanes = [threading.Thread(target=self.lane, args=(slot, worker, calibrated), daemon=True,
                                      name=f"gpu-worker-{slot}.{k}") for k in range(1, worker.lanes)]
            for t in lanes:
                t.start()
            self.lane(slot, worker, calibrated)
            for t in lanes:
                t.join()
            calibrated.result()   # ended (its harness gone) when no lane had a job to wait for it
        except BaseException as e:   # Cancelled (stopping), a grader bug
            self.errors.append(e)
            self.jobs.stop()

    def calibrating(self, slot: int, worker: GradeContext) -> concurrent.futures.Future:
        """The protocol's cost on GPU `slot` (calibrate_protocol), measured in a thread of its own
        while the first builds compile and the lanes begin their first runs (first_turn); the
        worker's own cost when nothing is graded."""
        cost: concurrent.futures.Future = concurrent.futures.Future()
        if not self.graded:
            cost.set_result(worker.protocol)
            return cost

        def calibrate() -> None:
            try:
                with gpu_worker(slot):
                    cost.set_result(calibrate_protocol(worker, reuse=self.reused))
            except BaseException as e:   # Cancelled (stopping), a grader bug: the lanes raise it
                cost.set_exception(e)

        threading.Thread(target=calibrate, daemon=True, name=f"gpu-calibrate-{slot}").start()
        return cost

    def lane(self, slot: int, worker: GradeContext,
             calibrated: concurrent.futures.Future | None = None) -> None:
        """One lane of GPU `slot`'s worker: jobs taken in turn, the next ones begun early
        (keep_warm) and each submission's check left behind its turn (checks_behind); the first
        one and those after it begun while the protocol is `calibrated` (first_turn)."""
        jobs = self.jobs
        try:
            with gpu_worker(slot), keep_warm(), checks_behind():
                job, ahead = jobs.take(slot), deque()
                while job is not None:
                    take_ahead(jobs, slot, ahead, worker.lookahead)   # begun while this one runs
                    if calibrated is not None:
                        worker, calibrated = first_turn(jobs, slot, job, ahead, worker, calibrated), None
                        if jobs.stopped:   # another worker stopped the run meanwhile
                            break
                    early().queue(list(ahead))
                    self.grade_job(job, worker)
                    job = ahead.popleft() if ahead and not jobs.stopped else jobs.take(slot)
                    if job is None:   # the queue is done: what the overloaded machine failed
                        behind().wait()   # the last check left behind may add to it
                        job = self.again_later()
        except BaseException as e:   # GpuUnhealthy, Cancelled (stopping), a grader bug
            self.errors.append(e)
            jobs.stop()

    def grade_job(self, job, worker: GradeContext) -> None:
        what, entry, sub, build_result = job
        if what == "baseline":
            behind().wait()   # timed alone: no check left behind runs beside it,
            early().settle()  # and no run begun early still starting CUDA (first_turn's)
            with alone(worker.gate):
                worker.progress.stage(entry.id, "time")
                result = grade_baseline(entry.id, worker)
            self.record(result, entry, worker)
            return
        started = time.monotonic()
        try:
            result = grade_submission(sub, build_result, worker, self.sources[id(sub)])
        except (GpuUnhealthy, Cancelled):
            raise
        except Exception as e:   # a grader bug: this submission's result says so, then go on
            result = self.grader_error(job, worker, e, started)
        if isinstance(result, Left):   # its check and verdict beside the next one's run stage
            lane_behind().leave(result, lambda left, got, error: self.finish_job(
                job, worker, got if error is None else self.grader_error(job, worker, error, started)))
            return
        self.finish_job(job, worker, result)

    def grader_error(self, job, worker: GradeContext, e: Exception,
                     started: float) -> SubmissionResult:
        """The result of a job whose grading hit a grader bug (never an unhealthy GPU or the run
        stopping: those stop the run)."""
        if isinstance(e, (GpuUnhealthy, Cancelled)):
            raise e
        _, _, sub, build_result = job
        worker.progress.note(f"{sub.id}: grader error\n"
                             f"{''.join(traceback.format_exception(e, limit=12))}")
        return _grader_error(sub, build_result, e, started)

    def finish_job(self, job, worker: GradeContext, result: SubmissionResult) -> None:
        """Record a submission's result; one whose cases the machine's load ended (or a check
        that broke beside another submission's code) is graded once more at the end of the run."""
        _, entry, _, build_result = job
        with self.lock:
            later = overloaded(result) and id(job) not in self.graded_again
            if later:   # graded once more at the end of the run, once the load has fallen
                self.graded_again.add(id(job))
                self.later.append(job)
        if not later:
            self.record(result, entry, worker if build_result.status is Status.PASS else None)

    def again_later(self):
        """A job whose cases the load rule ended (stages/run.py overloaded), to grade once more
        now that the queue is done, after waiting up to config.BUILD_RETRY_WAIT_S for the load per
        core to fall under config.BUILD_RETRY_CALM; None when there is none."""
        with self.lock:
            if not self.later:
                return None
            job = self.later.pop(0)
        self.ctx.progress.note(f"{job[1].id}: graded again, its cases having timed out while "
                               f"the machine was overloaded")
        return job if self.calm() else None

    def calm(self) -> bool:
        """Wait until the load per core is under config.BUILD_RETRY_CALM, for at most
        config.BUILD_RETRY_WAIT_S; False when the run stops meanwhile."""
        deadline = time.monotonic() + config.BUILD_RETRY_WAIT_S
        while machine_load() >= config.BUILD_RETRY_CALM and time.monotonic() < deadline:
            if self.halted.wait(2.0) or self.jobs.stopped:
                return False
        return True

    # ------------------------------------------------------------ the run

    def grade(self, build_jobs: int | None) -> list[SubmissionResult]:
        ctx = self.ctx
        if build_jobs is None:
            build_jobs = default_build_jobs(ctx.cpus)
        self.throttle = build_throttle(build_jobs, ctx, self.jobs.waiting)
        pool = self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, build_jobs))
        threads = [threading.Thread(target=self.work, args=(slot, w), name=f"gpu-worker-{slot}",
                                    daemon=True) for slot, w in enumerate(self.workers)]
        set_gpu_workers(len(self.workers))
        try:
            for s in self.to_build:
                pool.submit(self.build, s).add_done_callback(lambda f, s=s: self.built(s, f))
            for t in threads:
                t.start()
            while any(t.is_alive() for t in threads):
                for t in threads:
                    t.join(timeout=0.25)   # short waits: a Ctrl-C lands here at once
            if self.errors:
                raise self.errors[0]
        except BaseException:
            self.stop(pool, threads)
            raise
        finally:
            set_gpu_workers(1)
        pool.shutdown(wait=True)
        return self.results

    def stop(self, pool: concurrent.futures.ThreadPoolExecutor,
             threads: list[threading.Thread]) -> None:
        """Stop now: nothing queued starts, every child process group dies, then the threads
        (whose children just died) return at once. Unfinished work has no result on disk; a
        build that had already failed is a finished verdict, and is written."""
        self.halted.set()
        left = self.jobs.stop()
        cancel_all()
        pool.shutdown(wait=True, cancel_futures=True)
        for t in threads:
            if t.ident is not None:   # started
                t.join(timeout=60)
        for what, entry, sub, build_result in left:
            if what == "submission" and build_result.status is not Status.PASS:
                try:
                    self.record(grade_submission(sub, build_result, self.ctx, self.sources[id(sub)]),
                                entry, None, stopped=True)
                except Exception:   # stopping: what cannot be written now is graded next time
                    pass


def _grader_error(sub: Submission, build_result: BuildResult, e: Exception,
                  started: float) -> SubmissionResult:
    """The result of a submission whose grading hit a grader bug: it says so, and the run goes
    on. A full scratch disk is the machine's (not scored, graded again by the next run)."""
    status, message = Status.RUNTIME_ERROR, f"grader error: {e!r}; tell the instructor"
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        # the machine's scratch space, which another submission may have filled: never
        # this one's verdict; not scored, and graded again by the next run
        status, message = Status.ENVIRONMENT_ERROR, (
            f"the grading machine ran out of scratch space while grading this submission "
            f"({e!r}): the machine's fault, not your submission's; it will be graded again")
    return SubmissionResult(id=sub.id, label=label_of(sub), kind=sub.kind.value,
                            role=sub.role.value, status=status, message=message,
                            build=build_result, graded_at=now(),
                            wall_s=round(time.monotonic() - started, 2))


def build_order(subs: list[Submission]) -> list[Submission]:
    """The order builds start in: the folders that are neither kind first (a verdict at once),
    then the Python and CUDA ones in turn, a Python one first, each kind in the order given; the
    rest of one kind once the other runs out.

    The GPU stages take builds as they finish. A Python one first gives the GPU its first job
    within seconds (in the order given, a course whose CUDA ids sort first left the GPU idle for
    its first 100 s: session 11). All the Python ones first starve the GPU later: it grades them
    while the CUDA builds, started last and held to half the jobs meanwhile (BuildThrottle),
    compile; then it waits for each CUDA build. Session 34's cold course (50 Triton copies, 50
    CUDA ones compiling 90-110 s each) lost about 95 s so; in turn, the CUDA builds start from
    the first wave and the Python ones keep feeding the GPU while they compile
    (bench/build_order_sim.py: 617 s -> about 490 s on those figures; the same where the
    builds keep up)."""
    invalid = [s for s in subs if s.kind is Kind.INVALID]
    slow = [s for s in subs if s.kind is Kind.CUDA]   # compiles: 50-120 s
    quick = [s for s in subs if s.kind not in (Kind.INVALID, Kind.CUDA)]   # 10-20 s
    in_turn = itertools.chain.from_iterable(itertools.zip_longest(quick, slow))
    return invalid + [s for s in in_turn if s is not None]


def _pin_baselines(entries, workers: list[GradeContext], slot_of: dict[str, int]) -> None:
    """A baseline kept from an earlier run is timed again when it was timed on another GPU than
    the one it stands for now: each GPU's rows are compared with its own baselines."""
    for e in entries:
        if e.role != "baseline" or e.action != "skip" or e.existing is None:
            continue
        had, want = e.existing.gpu, workers[slot_of[e.gpu]].device.uuid
        if had is not None and had.uuid and want and had.uuid != want:
            e.action, e.why = "grade", f"it was timed on another GPU ({had.label}, {had.uuid})"


def _announce(entries, progress: Progress, *, only: set[str] | None) -> None:
    """Say what the run will do: how many are unchanged (skipped), kept (--only), regraded and why."""
    skip = sum(e.action == "skip" for e in entries)
    keep = [e for e in entries if e.action == "keep"]
    if skip:
        progress.note(f"{skip} of {len(entries)} unchanged since they were graded (same source, "
                      f"cases, grader, policy, device and limits): skipped; --force regrades them")
    if only is not None:
        none = sum(e.existing is None for e in keep)
        progress.note(f"--only: grading {len(entries) - len(keep)} of {len(entries)}; the other "
                      f"{len(keep)} keep their results" + (f" ({none} have none: shown as missing)"
                                                            if none else ""))
    reasons: dict[str, list[str]] = {}
    for e in entries:
        if e.action == "grade" and e.why and e.label not in reasons.get(e.why, ()):
            reasons.setdefault(e.why, []).append(e.label)   # a baseline once, not once per GPU
    for why, labels in reasons.items():
        shown = ", ".join(labels[:5]) + (f" and {len(labels) - 5} more" if len(labels) > 5 else "")
        progress.note(f"regrading {shown}: {why}")

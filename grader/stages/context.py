"""What every stage of a grading run is given: the GradeContext (cases, device, limits, folders,
sandbox, the GPU worker's slot and gate), made once per run (grading_context)."""

from __future__ import annotations

import dataclasses
import datetime
from pathlib import Path

from grader.build.cache import BuildCache
from grader.build.messages import StudentCheck
from grader.common import config
from grader.course.results import GpuRef
from grader.course.submission import Submission
from grader.course.verdicts import ProtocolCost
from grader.isolation.cpus import CpuSplit, split_cpus
from grader.isolation.device import DeviceInfo
from grader.isolation.procs import child_env
from grader.isolation.sandbox import Sandbox
from grader.problem import Case
from grader.report.progress import Progress
from grader.stages.turns import Gate


class GpuUnhealthy(RuntimeError):
    """The GPU failed its health check after a submission: grading cannot go on reliably."""


@dataclasses.dataclass(frozen=True)
class GradeContext:
    cases: tuple[Case, ...]
    device: DeviceInfo
    limits: config.Limits
    out_dir: Path
    build_dir: Path
    progress: Progress
    sandbox: Sandbox = Sandbox(None, "not set up")
    calibration: bool = False    # library calls allowed (timing calibration); never ranked
    precision: tuple[float, float] = (config.PRECISION_FACTOR, config.PRECISION_FLOOR)
    protocol: ProtocolCost = ProtocolCost()   # the protocol's own cost per timed call (calibrate_protocol)
    build_cache: BuildCache | None = None     # CUDA builds reused when unchanged (grader/build/cache.py)
    # The run's GPUs, one GPU worker each (worker_contexts); `device` is the first, or, in a
    # worker's context, its own (the `slot`-th). Empty or one: one worker, as before workers.
    gpus: tuple[DeviceInfo, ...] = ()
    slot: int = 0
    # Run and check stages of this many submissions at once on a GPU, each time stage alone
    # (config.GPU_LANES; grade --lanes); a worker's context holds its GPU's gate when above 1.
    lanes: int = 1
    gate: Gate | None = None
    # A student's `check` on their own machine, not a course's `grade`: a build's messages speak
    # of this machine and name the limit to raise, and it reports its progress (build/messages.StudentCheck).
    student_check: bool = False

    @property
    def device_name(self) -> str:
        return "cuda" if self.device.cuda else "cpu"

    @property
    def env(self) -> dict:
        """Every child's environment; its CUDA sees only this context's GPU."""
        return child_env(cuda=self.device.cuda, gpu=self.device.uuid)

    @property
    def workers(self) -> int:
        return max(1, len(self.gpus))

    @property
    def run_cpus(self) -> CpuSplit:
        """Where a run stage's harness and subject run: on the GPU stages' CPUs; when run stages
        share the GPU (lanes), on the builds' (idle in a regrade), leaving the GPU stages' three
        to the time stages and the checker. Session 16's lanes ran three run stages on those
        three, and their run stages took 5.5 s against 3.7 s (notes/throughput.md)."""
        cpus = self.cpus
        return cpus if self.gate is None else dataclasses.replace(cpus, gpu=cpus.build)

    @property
    def lookahead(self) -> int:
        """How many of a lane's next submissions are begun early (Lookahead): one per lane when
        run stages share the GPU, each with its run's and its time stage's subjects."""
        return 1 if self.gate is not None else config.LOOKAHEAD

    @property
    def cpus(self) -> CpuSplit:
        """Where the GPU stages and the builds run (cpus.split_cpus): calibration and every timed
        call see the same quiet CPUs, whatever compiles meanwhile; with several GPU workers, each
        its own."""
        if self.workers == 1:
            return split_cpus(self.limits.gpu_stage_cpus)
        return split_cpus(self.limits.gpu_stage_cpus, workers=self.workers, slot=self.slot)

    @property
    def gpu_tag(self) -> str:
        """'' for the run's first GPU (its results where they always were), 'gpu<index>' for
        another's copies of the baselines and protocol cost."""
        return f"gpu{self.device.index}" if self.slot and self.device.index is not None else \
            (f"gpu-slot{self.slot}" if self.slot else "")

    @property
    def gpu_ref(self) -> GpuRef | None:
        """What a result graded in this context records of its GPU."""
        d = self.device
        return GpuRef(index=d.index, name=d.name, uuid=d.uuid) if d.cuda else None


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def grading_context(*, cases, device: DeviceInfo, gpus: list[DeviceInfo], limits: config.Limits,
                    out_dir: Path, build_dir: Path, progress: Progress, sandbox: Sandbox,
                    calibration: bool, policy, build_cache: BuildCache | None,
                    lanes: int = 1, student_check: bool = False) -> GradeContext:
    """A grading run's context (`grade`, `check`, one Slurm task): one GPU worker per GPU of
    `gpus` when there are several, each with `lanes` (worker_contexts); `student_check` for
    `check` (GradeContext.student_check)."""
    return GradeContext(cases=tuple(cases), device=device, limits=limits, out_dir=out_dir, lanes=lanes,
                        build_dir=build_dir, progress=progress, sandbox=sandbox,
                        calibration=calibration,
                        precision=(policy.precision_factor, policy.precision_floor),
                        build_cache=build_cache, gpus=tuple(gpus) if len(gpus) > 1 else (),
                        student_check=student_check)


def student_check(ctx: GradeContext, sub: Submission) -> StudentCheck | None:
    """What a build of `check` reports to (build/messages.StudentCheck): the run's display, as the build
    stage's line (in place, every second, in a terminal; a line every config.BUILD_PROGRESS_S
    seconds otherwise). None in a course's `grade`: its display shows every submission at once."""
    if not ctx.student_check:
        return None
    every = 1.0 if ctx.progress.in_place else config.BUILD_PROGRESS_S
    return StudentCheck(report=lambda line: ctx.progress.stage(sub.id, f"build: {line}"),
                        every_s=every)


def gpu_records(gpus: list[DeviceInfo]) -> list[dict]:
    """The run file's record of the GPUs a run grades on."""
    return [dict(index=d.index, name=d.name, uuid=d.uuid, matmul_tflops=d.matmul_tflops)
            for d in gpus]


def health_checks_of(ctx: GradeContext) -> int:
    """Its GPU's count of health checks (GpuGate.health_check); 0 where no lanes share the GPU."""
    return ctx.gate.health_checks if ctx.gate is not None else 0

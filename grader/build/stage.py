"""Build stage: compile a CUDA submission (or import a Python one) in a child process.

With a GPU, CUDA submissions are built exactly as a CS149-style wrapper does it,
`torch.utils.cpp_extension.load_inline(..., functions=["flash_attention_forward"])`, with ninja,
for the GPU's own architecture, in a build folder of their own. Without one, the same source is
compile-checked with nvcc (no link: a CPU build of torch has no CUDA libraries to link against).
Both have CUTLASS's and CuTe's headers (the nvidia-cutlass wheel: cutlass_include) on their
include path, for the CuTe track.

Every CUDA build starts from an empty build folder. A build that nothing it depends on has changed
since (build_inputs) is not compiled again: its files come back from the build cache
(grader/build/cache.py), checked, and the stage's result is the one that build had.

What a CUDA build includes and defines is read from what the compiler did, never from the text:
every header its translation unit opened (the compiler's dependency output, HEADERS_RECORD) and
the __global__ functions its object defines (BuildResult.kernels). grader/trusted/audit/reach.py audits both.

A build is a course's (`grade`) or a student's own check (`check`: StudentCheck). The machine a
message speaks of differs: a course's grading machine, which the instructor fixes, or the
student's own, whose limits the student may raise (GRADER_BUILD_S). In a check the build also
reports what it is doing while it runs (BuildWatch: the compiler's phase and the time so far).

This module is the stage's flow (build_submission: the cache, the second try, the child process and
its result). Its parts: messages.py (what a build says of the machine), watch.py (a check's
progress), inputs.py (the cache's key), flags.py (flags and include folders), log.py (reading a
build's output), child.py (the build child, run as `python -m grader.build.stage`) and headers.py
(the record of the headers a build opened).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from grader.build.cache import BuildCache, empty_folder
from grader.build.inputs import build_inputs, cuda_mode
from grader.build.log import _first_error, environment_problem, relevant_log
from grader.build.messages import NOT_YOURS, StudentCheck, machine_words, slow_build_message
from grader.build.watch import BuildWatch
from grader.common import config
from grader.common.status import Status
from grader.course.submission import Kind, Submission
from grader.course.verdicts import BuildResult
from grader.isolation.cpus import build_priority, split_cpus
from grader.isolation.device import DeviceInfo
from grader.isolation.procs import ProcResult, child_env, run_limited
from grader.isolation.quota import QUOTA
from grader.isolation.sandbox import Sandbox, give_to_sandbox
from grader.trusted.audit.includes import HEADERS_RECORD
from grader.trusted.audit.reach import STUDENT_OBJECT


def build_submission(sub: Submission, *, build_dir: Path, device: DeviceInfo,
                     limits: config.Limits, log_path: Path | None = None,
                     sandbox: Sandbox | None = None, cache: BuildCache | None = None,
                     student_check: StudentCheck | None = None) -> BuildResult:
    """Build or import-check one submission; never raises for the submission's faults. With a
    `cache` and an active `sandbox` (grader/build/cache.py: only then can no submission write
    the cache), a CUDA build whose inputs are unchanged is restored from it rather than
    compiled, and a successful one is stored.

    A failure of the grading machine (a module or tool the set-up provides is missing) is an
    ENVIRONMENT_ERROR, never the student's; it is tried once more. So is a timeout while the
    machine is overloaded (config.OVERLOADED_PER_CORE): if the second try times out under the
    same load, the machine cannot tell a slow build from a hung one, and says so. In a
    `student_check` the machine is the student's own: a timeout is a TIMEOUT that names the
    limit to raise, and the build reports its progress (StudentCheck)."""
    built = _build_submission(sub, build_dir=build_dir, device=device, limits=limits,
                              log_path=log_path, sandbox=sandbox, cache=cache,
                              student_check=student_check)
    # Its messages speak of the student's machine (messages.machine_words): the hints read this.
    return dataclasses.replace(built, students_machine=True) if student_check is not None else built


def _build_submission(sub: Submission, *, build_dir: Path, device: DeviceInfo,
                      limits: config.Limits, log_path: Path | None, sandbox: Sandbox | None,
                      cache: BuildCache | None, student_check: StudentCheck | None) -> BuildResult:
    if sub.kind is Kind.INVALID:
        return BuildResult(Status.ENVIRONMENT_ERROR if sub.machine_fault else Status.BUILD_ERROR,
                           "none", 0.0, message=sub.problem)
    machine, fault = machine_words(student_check)
    if sub.kind is Kind.CUDA and device.nvcc is None:
        return BuildResult(Status.ENVIRONMENT_ERROR, "none", 0.0, message=(
            f"{machine} has no nvcc (the CUDA toolkit): install it or set CUDA_HOME. {fault}"))
    sandboxed = sandbox is not None and sandbox.active
    if sub.kind is not Kind.CUDA or cache is None or not cache.usable or not sandboxed:
        built = _build_tried(sub, build_dir=build_dir, device=device, limits=limits,
                             log_path=log_path, sandbox=sandbox, student_check=student_check)[0]
    else:
        built = _build_cached(sub, cache, build_dir=build_dir.resolve(), device=device,
                              limits=limits, log_path=log_path, sandbox=sandbox,
                              student_check=student_check)
    return with_kernels(built, build_dir, student_check=student_check) \
        if sub.kind is Kind.CUDA else built


def with_kernels(built: BuildResult, build_dir: Path, *,
                 student_check: StudentCheck | None = None) -> BuildResult:
    """A passing CUDA build with what its object defines (BuildResult.kernels), read here, in
    the grader's process, from the object it left or the cache restored; and with its record of
    the headers it opened checked for. Without either, the build cannot be audited: the
    machine's failure (ENVIRONMENT_ERROR), never a pass."""
    if built.status is not Status.PASS:
        return built
    from grader.trusted.audit.includes import read_headers_record
    from grader.trusted.audit.object_file import defined_kernels
    from grader.trusted.audit.findings import AuditUnavailable
    try:
        read_headers_record(Path(build_dir) / HEADERS_RECORD)
        kernels = defined_kernels(Path(build_dir) / STUDENT_OBJECT)
    except (AuditUnavailable, OSError, subprocess.SubprocessError) as e:
        machine, fault = machine_words(student_check)
        return dataclasses.replace(built, status=Status.ENVIRONMENT_ERROR, message=(
            f"{machine} cannot read what the build made: {e}. {fault}"))
    return dataclasses.replace(built, kernels=tuple(kernels))


def _build_cached(sub: Submission, cache: BuildCache, *, build_dir: Path, device: DeviceInfo,
                  limits: config.Limits, log_path: Path | None, sandbox: Sandbox | None,
                  student_check: StudentCheck | None = None) -> BuildResult:
    """A CUDA build through the cache: restored when its inputs have an entry, else built (from
    an empty folder) and, when it passes, stored. Only passing builds are kept: a failure may be
    the machine's or a limit's, and costs the same to find again."""
    mode = cuda_mode(device)
    inputs = build_inputs(sub, device)
    started = time.monotonic()
    hit = cache.restore(inputs, build_dir)
    if hit is not None:
        _write_log(log_path, f"[build cache: nothing compiled; the files of the build of "
                             f"{hit.created_at} ({hit.compile_s:.1f} s), entry {hit.key}, checked "
                             f"and reused]\n{hit.log}")
        return BuildResult(Status.PASS, mode, time.monotonic() - started,
                           artifact=artifact_path(build_dir, mode, sub.module_name),
                           log_tail=hit.log_tail, reused=True)
    built, output = _build_tried(sub, build_dir=build_dir, device=device, limits=limits,
                                 log_path=log_path, sandbox=sandbox, student_check=student_check)
    if built.status is Status.PASS:
        if build_inputs(sub, device) != inputs:   # the folder changed while it compiled
            return built
        not_stored = cache.store(inputs, build_dir, cached_files(mode, sub.module_name),
                                 compile_s=built.elapsed_s, log=output, log_tail=built.log_tail)
        if not_stored:
            print(f"build cache: {sub.module_name}: {not_stored}", file=sys.stderr, flush=True)
    return built


def _build_tried(sub: Submission, *, build_dir: Path, device: DeviceInfo, limits: config.Limits,
                 log_path: Path | None, sandbox: Sandbox | None,
                 student_check: StudentCheck | None = None) -> tuple[BuildResult, str]:
    """One try, and a second where the machine may be at fault; the result and the output of
    the try it comes from. In a `student_check` a timeout is not tried again: its message says
    how to give this machine more time (slow_build_message)."""
    # The load is read before each try: during one, the submission's own processes add to it,
    # and a hung build must not be able to make its own timeout look like the machine's.
    load = machine_load()
    if student_check is None:   # a course's build: its limit follows the machine's load
        limits = under_load(limits, load)
    watch = BuildWatch(sub, limits, student_check) if student_check is not None else None
    # (only a check's build is watched; a course's calls _build_once as it always did)
    watched = {"watch": watch} if watch is not None else {}
    first, output = _build_once(sub, build_dir=build_dir, device=device, limits=limits,
                                log_path=log_path, sandbox=sandbox, **watched)
    if first.status is Status.TIMEOUT and watch is not None:
        return dataclasses.replace(first, message=slow_build_message(
            watch.what, watch.limit_s, source_name=sub.source.name,
            phase=watch.phase, load=load)), output
    if first.status is Status.ENVIRONMENT_ERROR:
        retry_why = f"{machine_words(student_check)[0]} failed"
    elif first.status is Status.TIMEOUT and load >= config.OVERLOADED_PER_CORE:
        retry_why = f"the machine was overloaded (load {load:.1f} per core)"
    else:
        return first, output
    load = min(load, machine_load())
    second, output = _build_once(sub, build_dir=build_dir, device=device, limits=limits,
                                 log_path=log_path, sandbox=sandbox, **watched)
    elapsed = round(first.elapsed_s + second.elapsed_s, 2)
    note = f"tried twice: {retry_why} on the first try"
    if second.status is Status.TIMEOUT and first.status is Status.TIMEOUT:
        if load >= config.OVERLOADED_PER_CORE:
            return dataclasses.replace(second, status=Status.ENVIRONMENT_ERROR, elapsed_s=elapsed,
                                       under_load=True,
                                       message=(f"{second.message} twice, while the grading machine "
                                                f"was overloaded (load {load:.1f} per core): it "
                                                f"cannot tell slow from hung. " + NOT_YOURS)), output
    return dataclasses.replace(second, elapsed_s=elapsed, message=(
        f"{second.message} ({note})" if second.message else note)), output


def artifact_path(build_dir: Path, mode: str, module_name: str) -> str | None:
    """The extension module a passing build leaves (a compile check leaves none)."""
    return str(build_dir / f"{module_name}.so") if mode == "extension" else None


def cached_files(mode: str, module_name: str) -> list[str]:
    """The files of a build folder that later stages read, and so the build cache keeps: the
    extension module (the subject loads it), the object compiled from the submission's
    translation unit (the reach audit reads its imports and kernels) and the record of the
    headers that unit opened (the audit reads which)."""
    return ([f"{module_name}.so"] if mode == "extension" else []) + [STUDENT_OBJECT, HEADERS_RECORD]


def _write_log(log_path: Path | None, text: str) -> None:
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(text)


def under_load(limits: config.Limits, load: float) -> config.Limits:
    """A course build's limits on a machine whose load per core is `load`, read before the build
    starts: a compile that gets 1/load of a core takes about load times as long, so its limit is
    scaled by the load, between 1 and config.BUILD_LOAD_SCALE_MAX. The limit a timeout names is
    the scaled one (BuildResult's message says so). Builds of the run itself keep the load near 1
    per core (one job per build CPU): only others' work, or a machine shared with another run,
    raises it. A student's check keeps its limit: the message of its timeout names the knob."""
    scale = min(max(load, 1.0), config.BUILD_LOAD_SCALE_MAX)
    if scale <= 1.0:
        return limits
    return dataclasses.replace(limits, build_s=round(limits.build_s * scale, 1),
                               import_s=round(limits.import_s * scale, 1),
                               load_scale=round(scale, 2))


def machine_load() -> float:
    """The machine's 1-minute load average per CPU core (0 where the OS has none)."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return 0.0


def _build_once(sub: Submission, *, build_dir: Path, device: DeviceInfo, limits: config.Limits,
                log_path: Path | None, sandbox: Sandbox | None,
                watch: "BuildWatch | None" = None) -> tuple[BuildResult, str]:
    """One try; its result and its whole (capped) output. A `watch` (a student's check) follows
    the build's processes while it runs and reports its progress."""
    build_dir = build_dir.resolve()   # the build runs in the submission's folder
    if sub.kind is Kind.CUDA:
        # From nothing: torch rewrites only sources that changed and ninja trusts file times, so
        # an object left by an earlier build (or restored from the cache) could be linked again.
        empty_folder(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    give_to_sandbox(build_dir)        # the sandboxed build writes here, as nobody
    if sub.kind is Kind.PYTHON:   # importing runs its code: that happens in a subject only
        mode, timeout = "import", limits.import_s
        subject = config.GRADER_DIR / "subject" / "loop.py"
        cmd = [sys.executable, str(subject), "--check-load",
               json.dumps(dict(kind="python", source=str(sub.source)))]
    else:   # build_submission made sure there is an nvcc
        mode = cuda_mode(device)
        timeout = limits.build_s
        cmd = [sys.executable, "-m", "grader.build.stage", mode, str(sub.source), "--name",
               sub.module_name, "--build-dir", str(build_dir), "--arch", device.arch,
               "--nvcc", device.nvcc]
    # No GPU at all: a build runs beside other submissions' timed calls (a Python submission's
    # import runs its code), and a compile needs none (the architecture is given).
    env = child_env(cuda=device.cuda)
    env["CUDA_VISIBLE_DEVICES"] = ""
    sandbox = sandbox.without_gpus() if sandbox is not None else None
    split = split_cpus(limits.gpu_stage_cpus)
    nice = build_priority(limits.build_nice, gpu=device.cuda, split=split)
    if sandbox is not None:   # the build sees neither the solution nor anyone else's code
        cmd = sandbox.wrap(cmd, writable=[build_dir], readonly=[sub.path], nice=nice)
    memory = int(limits.build_memory_gb * (1 << 30)) if sub.kind is Kind.CUDA else None
    hooks = QUOTA.hooks(build_dir, spare_root=False)
    if watch is not None:
        hooks = watch.hooks(hooks)
    with QUOTA.watch(build_dir, int(limits.folder_gb * (1 << 30)), limits.folder_files):
        proc = run_limited(cmd, timeout_s=timeout, env=env, cwd=sub.path,
                           head_bytes=limits.output_head_bytes, tail_bytes=limits.output_tail_bytes,
                           memory_bytes=memory,
                           file_bytes=int(limits.file_gb * (1 << 30)),
                           cpus=split.build,   # off the timed calls' CPUs
                           nice=nice, **hooks)
        over = QUOTA.over(build_dir)
    if sub.kind is Kind.PYTHON:   # an import check leaves nothing a later stage reads: what its
        empty_folder(build_dir)   # code wrote there does not outlive the watch
    _write_log(log_path, proc.output)
    if over is not None:
        return BuildResult(Status.BUILD_ERROR, mode, proc.elapsed_s,
                           message=over.message("its build folder")), proc.output
    if mode == "import" and device.cuda and not proc.ok and not proc.timed_out \
            and NEEDS_A_GPU.search(proc.output):
        return BuildResult(Status.PASS, mode, proc.elapsed_s,
                           artifact=artifact_path(build_dir, mode, sub.module_name),
                           message="uses the GPU when imported: imported on its GPU, at its first case",
                           log_tail=relevant_log(proc.output, sub.source.name)), proc.output
    return _interpret(proc, mode, sub, build_dir, timeout, limits=limits,
                      student_check=watch.check if watch is not None else None), proc.output


# A Python submission's import check runs with no GPU (it overlaps other submissions' timed calls
# on a GPU machine, tests/adversarial/import_gpu_hog_py). A file that uses the GPU when imported
# (a device query, a constant on the GPU) fails there with one of these; it is then imported on
# its own GPU worker's GPU by the run stage, whose load error is its first case's verdict.
NEEDS_A_GPU = re.compile(r"No CUDA GPUs are available|no CUDA-capable device|Found no NVIDIA "
                         r"driver|CUDA driver initialization failed|cudaErrorNoDevice|"
                         r"0 active drivers")


def _interpret(proc: ProcResult, mode: str, sub: Submission, build_dir: Path,
               timeout: float, *, student_check: StudentCheck | None = None,
               limits: config.Limits | None = None) -> BuildResult:
    what = "import" if mode == "import" else "compile"
    if proc.timed_out:
        scaled = (f" (the limit times {limits.load_scale:g} for the grading machine's load)"
                  if limits is not None and limits.load_scale > 1 else "")
        return BuildResult(Status.TIMEOUT, mode, proc.elapsed_s,
                           message=f"{what} did not finish within {timeout:.0f} s{scaled}",
                           log_tail=proc.tail(30))
    if not proc.ok:   # an import's output is the student's own traceback (subject/loop.py): whole
        log = proc.tail(60) if mode == "import" else relevant_log(proc.output, sub.source.name)
        missing = environment_problem(proc.output, mode)
        if missing:
            machine, fault = machine_words(student_check)
            return BuildResult(Status.ENVIRONMENT_ERROR, mode, proc.elapsed_s,
                               message=f"{machine} {missing}. {fault}", log_tail=log)
        first = proc.last_exception() if mode == "import" else _first_error(log)
        return BuildResult(Status.BUILD_ERROR, mode, proc.elapsed_s,
                           message=f"{what} failed" + (f": {first.strip()}" if first else ""),
                           log_tail=log)
    return BuildResult(Status.PASS, mode, proc.elapsed_s,
                       artifact=artifact_path(build_dir, mode, sub.module_name),
                       log_tail=relevant_log(proc.output, sub.source.name, errors_only=True))


if __name__ == "__main__":   # the build child (_build_once's command line): grader/build/child.py
    from grader.build.child import main
    main()

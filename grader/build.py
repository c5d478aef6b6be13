"""Build stage: compile a CUDA submission (or import a Python one) in a child process.

With a GPU, CUDA submissions are built exactly as a CS149-style wrapper does it,
`torch.utils.cpp_extension.load_inline(..., functions=["flash_attention_forward"])`, with ninja,
for the GPU's own architecture, in a build folder of their own. Without one, the same source is
compile-checked with nvcc (no link: a CPU build of torch has no CUDA libraries to link against).
Both have CUTLASS's and CuTe's headers (the nvidia-cutlass wheel: cutlass_include) on their
include path, for the CuTe track.

Every CUDA build starts from an empty build folder. A build that nothing it depends on has changed
since (build_inputs) is not compiled again: its files come back from the build cache
(grader/build_cache.py), checked, and the stage's result is the one that build had.

What a CUDA build includes and defines is read from what the compiler did, never from the text:
every header its translation unit opened (the compiler's dependency output, HEADERS_RECORD) and
the __global__ functions its object defines (BuildResult.kernels). grader/reach.py audits both.

A build is a course's (`grade`) or a student's own check (`check`: StudentCheck). The machine a
message speaks of differs: a course's grading machine, which the instructor fixes, or the
student's own, whose limits the student may raise (GRADER_BUILD_S). In a check the build also
reports what it is doing while it runs (BuildWatch: the compiler's phase and the time so far).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
import warnings
from pathlib import Path
from typing import Callable, Iterable, Sequence

from . import config
from .build_cache import BuildCache, empty_folder
from .device import DeviceInfo, find_nvcc
from .procs import ProcResult, child_env, process_tree, run_limited, split_cpus
from .quota import QUOTA
from .sandbox import Sandbox, give_to_sandbox
from .status import Status
from .submission import Kind, Submission

# load_inline puts these three lines above the student's source in cuda.cu, compiled to
# STUDENT_OBJECT (with a GPU and in a compile check alike): everything the submission wrote is in it.
STUDENT_OBJECT = "cuda.cuda.o"
LOAD_INLINE_PRELUDE = ["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>"]
# Beside it, the build child's record of every file that translation unit opened (record_headers),
# read by the reach audit (reach.cpp_includes) and kept by the build cache.
HEADERS_RECORD = "headers.json"
HEADERS_SCHEMA = 1
# Where nvcc writes its dependency list in a compile check (-MD -MF); the extension's build has
# torch's ninja rule write it, and ninja keeps it (.ninja_deps).
DEPFILE = STUDENT_OBJECT + ".d"


@dataclasses.dataclass(frozen=True)
class BuildResult:
    status: Status            # PASS, BUILD_ERROR, TIMEOUT or ENVIRONMENT_ERROR
    mode: str                 # 'extension', 'compile_only' or 'import'
    elapsed_s: float
    artifact: str | None = None   # the built extension module (.so)
    message: str = ""             # one line for the student
    log_tail: str = ""            # the relevant part of the compiler's output
    reused: bool = False          # its files came from the build cache: nothing was compiled
    # The __global__ functions the object compiled from the submission's translation unit defines
    # (reach.defined_kernels, demangled), filled when a CUDA build passes, a restored one too: the
    # kernels it may call its own (integrity.cpp_kernel_names). Empty for Python and failures.
    kernels: tuple[str, ...] = ()
    # What the audit of a passing CUDA build found for an instructor (reach.native_review, filled
    # by the pipeline's audit of the build): why it goes to review, and notes 'where: what' on
    # unusual but allowed constructs (those reasons among them).
    review: tuple[str, ...] = ()
    audit_notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "BuildResult":
        """From to_dict's output, or an older result file's (no kernels, review or notes: none
        known)."""
        return cls(**{**d, "status": Status(d["status"]),
                      **{k: tuple(d.get(k) or ()) for k in ("kernels", "review", "audit_notes")}})


@dataclasses.dataclass(frozen=True)
class StudentCheck:
    """A build for a student's `check` (make check, python -m grader check) on their own machine,
    not for a course's `grade`. Its messages speak of this machine: a timeout says the machine
    may be slow or busy and names the limit to raise (slow_build_message), and is not tried
    again (a second try only doubles the wait); a missing tool is this machine's set-up. While
    it runs, `report` gets a line on what it is doing (progress_line) every `every_s` seconds:
    a terminal's live display updates one line in place (often), a log gets a line each time."""
    report: Callable[[str], None] | None = None
    every_s: float = config.BUILD_PROGRESS_S


def build_submission(sub: Submission, *, build_dir: Path, device: DeviceInfo,
                     limits: config.Limits, log_path: Path | None = None,
                     sandbox: Sandbox | None = None, cache: BuildCache | None = None,
                     student_check: StudentCheck | None = None) -> BuildResult:
    """Build or import-check one submission; never raises for the submission's faults. With a
    `cache` and an active `sandbox` (grader/build_cache.py: only then can no submission write
    the cache), a CUDA build whose inputs are unchanged is restored from it rather than
    compiled, and a successful one is stored.

    A failure of the grading machine (a module or tool the set-up provides is missing) is an
    ENVIRONMENT_ERROR, never the student's; it is tried once more. So is a timeout while the
    machine is overloaded (config.OVERLOADED_PER_CORE): if the second try times out under the
    same load, the machine cannot tell a slow build from a hung one, and says so. In a
    `student_check` the machine is the student's own: a timeout is a TIMEOUT that names the
    limit to raise, and the build reports its progress (StudentCheck)."""
    if sub.kind is Kind.INVALID:
        return BuildResult(Status.BUILD_ERROR, "none", 0.0, message=sub.problem)
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
    from .reach import AuditUnavailable, defined_kernels, read_headers_record
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
                                       message=(f"{second.message} twice, while the grading machine "
                                                f"was overloaded (load {load:.1f} per core): it "
                                                f"cannot tell slow from hung. " + NOT_YOURS)), output
    return dataclasses.replace(second, elapsed_s=elapsed, message=(
        f"{second.message} ({note})" if second.message else note)), output


def cuda_mode(device: DeviceInfo) -> str:
    """'extension' (built and linked for this GPU) or 'compile_only' (no GPU: compiled, not run)."""
    return "extension" if device.cuda else "compile_only"


def artifact_path(build_dir: Path, mode: str, module_name: str) -> str | None:
    """The extension module a passing build leaves (a compile check leaves none)."""
    return str(build_dir / f"{module_name}.so") if mode == "extension" else None


def cached_files(mode: str, module_name: str) -> list[str]:
    """The files of a build folder that later stages read, and so the build cache keeps: the
    extension module (the subject loads it), the object compiled from the submission's
    translation unit (the reach audit reads its imports and kernels) and the record of the
    headers that unit opened (the audit reads which)."""
    return ([f"{module_name}.so"] if mode == "extension" else []) + [STUDENT_OBJECT, HEADERS_RECORD]


# Environment variables the compilers or torch's extension builder read (the build's child
# inherits the grader's environment): part of every cache key.
BUILD_ENV = ("CC", "CXX", "CUDA_HOME", "CUDA_PATH", "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS",
             "NVCC_CCBIN", "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "LIBRARY_PATH",
             "TORCH_CUDA_ARCH_LIST", "GRADER_CUDA_INCLUDE")
# The grader's code that decides a build's command line and translation unit (load_inline's
# call, the flags, the prelude, the compile check's light extension.h, the entry declaration).
BUILD_CODE = ("build.py", "config.py")


def build_inputs(sub: Submission, device: DeviceInfo) -> dict:
    """Everything that decides the files a CUDA build leaves: the build cache's key.

    The submission folder's every file (a build can read any of them, by an absolute #include),
    its module name (compiled in: PyInit_<name>, TORCH_EXTENSION_NAME; two students with the
    same file never share a build), the mode and architecture, the flags, the compilers' own
    version reports, torch's, CUDA's and Python's versions, the environment the compilers read,
    the grader's build code and the compile check's extra headers. Every cached build is
    sandboxed, so it could read nothing else. Resource limits are not in it: they decide whether
    a build finishes, not what a finished one leaves."""
    from .runs import folder_digest   # runs -> results -> build: not importable at the top
    mode = cuda_mode(device)
    inputs = dict(
        mode=mode, module=sub.module_name, source=folder_digest(sub.path, hex_chars=64),
        arch=device.arch, cflags=list(EXTRA_CFLAGS),
        cuda_cflags=[*EXTRA_CUDA_CFLAGS, *arch_flags(device.arch)], ldflags=list(driver_ldflags()),
        torch=device.torch_version, cuda=device.cuda_version, python=device.python,
        toolchain=toolchain(device.nvcc, os.environ.get("CXX", "c++"), os.environ.get("CC", "gcc")),
        env={name: os.environ.get(name) for name in BUILD_ENV}, grader=build_code_digest())
    if mode == "compile_only":
        inputs["headers"] = headers_digest(tuple(cuda_include_dirs()))
    inputs["cutlass"] = cutlass_identity()
    return inputs


@functools.lru_cache(maxsize=None)
def toolchain(nvcc: str | None, cxx: str, cc: str) -> dict:
    """What each compiler a build runs says of itself (path and `--version`): nvcc; the C++
    compiler torch compiles the binding and links with ($CXX, else c++); nvcc's host compiler
    ($CC, which torch passes as -ccbin, else gcc and g++ from PATH)."""
    return {name: _version_report(tool) for name, tool in
            dict(nvcc=nvcc, cxx=cxx, cc=cc, gxx="g++").items()}


def _version_report(tool: str | None) -> str:
    path = shutil.which(tool) if tool else None
    if path is None:
        return f"{tool}: not found"
    try:
        proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60,
                              errors="replace")
    except (OSError, subprocess.SubprocessError) as e:
        return f"{os.path.realpath(path)}: {e}"
    return f"{os.path.realpath(path)}\n{proc.stdout.strip()}"


@functools.lru_cache(maxsize=None)
def build_code_digest() -> str:
    here = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for name in BUILD_CODE:
        h.update(name.encode() + b"\0" + (here / name).read_bytes() + b"\0")
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def headers_digest(dirs: tuple[str, ...]) -> str:
    """The compile check's extra headers (cuda_include_dirs): each file's path, size and time."""
    h = hashlib.sha256()
    for d in dirs:
        for root, subdirs, files in os.walk(d):
            subdirs.sort()
            for name in sorted(files):
                st = os.stat(os.path.join(root, name))
                h.update(f"{os.path.relpath(os.path.join(root, name), d)}\0{st.st_size}\0"
                         f"{st.st_mtime_ns}\0".encode())
    return h.hexdigest()


def _write_log(log_path: Path | None, text: str) -> None:
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(text)


# Said to the student whenever the machine, not the submission, failed.
NOT_YOURS = ("This is not your fault and it is not graded: the instructor fixes the machine and "
             "grades it again.")
# The same in a student's check, on their own machine: nobody else will fix it.
YOUR_MACHINE = ("It is this machine's set-up, not your code: make env sets it up again "
                "(scripts/bootstrap.sh); if that does not help, ask your instructor.")


def machine_words(student_check: StudentCheck | None) -> tuple[str, str]:
    """How a build's message names the machine, and what it says of the machine's fault: a
    course's grading machine (`grade`), or, in a student's check, their own."""
    if student_check is None:
        return "the grading machine", NOT_YOURS
    return "this machine", YOUR_MACHINE


# A check's limits, as a student raises them: Limits.from_env's variables for Limits.build_s and
# Limits.import_s, which `make check` passes on (make check GRADER_BUILD_S=900).
LIMIT_ENV = {"compile": "GRADER_BUILD_S", "import": "GRADER_IMPORT_S"}


def slow_build_message(what: str, limit_s: float, *, source_name: str, phase: str,
                       load: float) -> str:
    """A student's check whose compile (or a Python file's import) ran past its limit: what was
    running when it stopped, that this machine may be slow or busy, and the limit to raise, as
    a `make check` variable and as the environment variable python -m grader reads."""
    knob = LIMIT_ENV[what]
    more = max(900, -(-3 * int(limit_s) // 100) * 100)   # three times as long, at least 900 s
    # (a compile's hint, grader/hints.py, names what makes a compile itself slow)
    stuck = " If it never finishes, look at what your file runs when it is imported." \
        if what == "import" else ""
    return (f"the {what} of {source_name} did not finish in {limit_s:.0f} s"
            f"{f' (it was in: {phase})' if phase else ''}: this machine may be slow or busy (load "
            f"{load:.1f} per core when it began). Raise the limit: make check {knob}={more} (for "
            f"python -m grader check, the environment variable {knob}={more}).{stuck}")


def machine_load() -> float:
    """The machine's 1-minute load average per CPU core (0 where the OS has none)."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return 0.0


# What a student's check shows while it compiles. nvcc prints nothing until it ends, and the
# build's output goes to its log, so the phase is read from the processes the build runs (its
# process tree, in /proc): nvcc runs one tool after another for a .cu file (the preprocessor,
# cudafe++, cicc, ptxas, fatbinary, the host compiler); torch's ninja build (with a GPU) runs nvcc
# on cuda.cu beside c++ on main.cpp, then links. Each tool's process name, and the phase it is.
_TOOL_PHASES = {
    "cudafe++": "front end (cudafe++)", "cicc": "device code (cicc)", "ptxas": "ptxas",
    "fatbinary": "fatbinary", "nvlink": "device link (nvlink)", "as": "host compiler",
    "collect2": "link", "ld": "link", "ld.bfd": "link", "ld.gold": "link", "ld.lld": "link",
    "mold": "link",
}
# Host compilers proper (gcc's cc1plus, also nvcc's preprocessor when given -E).
_HOST_COMPILERS = ("cc1plus", "cc1")
# In the order a build goes through them; a driver alone (between its tools) says where it is.
BUILD_PHASES = ("preprocessor", "front end (cudafe++)", "device code (cicc)", "ptxas", "fatbinary",
                "host compiler", "device link (nvlink)", "link")
_DRIVER_PHASES = {"nvcc": "nvcc", "ninja": "ninja"}


def build_phase(processes: Iterable[tuple[str, Sequence[str]]]) -> str:
    """The phase a build is in, from its running processes, each (name, argv) as /proc gives them
    (comm, cmdline): the tools' phases in BUILD_PHASES order, joined by ' + ' when several run at
    once; else the driver that runs between them (nvcc, ninja); else 'starting (Python, torch)'
    while only Python runs (the build child loads torch); '' when nothing is known."""
    tools, drivers, python = set(), set(), False
    for name, argv in processes:
        names = {name, os.path.basename(argv[0]) if argv else ""}
        if names & set(_HOST_COMPILERS):
            tools.add("preprocessor" if "-E" in argv else "host compiler")
        elif names & set(_TOOL_PHASES):
            tools.update(_TOOL_PHASES[n] for n in names & set(_TOOL_PHASES))
        elif names & set(_DRIVER_PHASES):
            drivers.update(_DRIVER_PHASES[n] for n in names & set(_DRIVER_PHASES))
        elif any(n.startswith("python") for n in names):
            python = True
    if tools:
        return " + ".join(p for p in BUILD_PHASES if p in tools)
    if drivers:
        return " + ".join(sorted(drivers))
    return "starting (Python, torch)" if python else ""


def progress_line(what: str, source_name: str, phase: str, elapsed_s: float, limit_s: float) -> str:
    """'compiling submission.cu: ptxas, 42 s (limit 300 s: GRADER_BUILD_S)'."""
    doing = "compiling" if what == "compile" else "importing"
    return (f"{doing} {source_name}{f': {phase}' if phase else ''}, {elapsed_s:.0f} s "
            f"(limit {limit_s:.0f} s: {LIMIT_ENV[what]})")


def _running(root: int) -> list[tuple[str, list[str]]]:
    """(comm, argv) of `root` and every process under it, as /proc shows them now."""
    found = []
    for pid in process_tree(root):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:   # it ended meanwhile
            continue
        found.append((name, [a.decode(errors="replace") for a in argv if a]))
    return found


class BuildWatch:
    """Follows one build of a student's check while it runs: every second, the phase its
    processes are in (build_phase), kept for the timeout's message; every `check.every_s`
    seconds, a progress_line to `check.report`."""

    SAMPLE_S = 1.0

    def __init__(self, sub: Submission, limits: config.Limits, check: StudentCheck):
        self.check = check
        self.what = "import" if sub.kind is Kind.PYTHON else "compile"
        self.limit_s = limits.import_s if sub.kind is Kind.PYTHON else limits.build_s
        self.source_name = sub.source.name if sub.source is not None else "submission"
        self.phase = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def hooks(self, inner: dict) -> dict:
        """procs.run_limited's `started` and `ended`: `inner`'s (the quota's), and this watch
        from the moment the build starts until it ends."""
        def started(pid: int) -> None:
            inner["started"](pid)
            self._stop.clear()
            self.phase = ""
            self._thread = threading.Thread(target=self._follow, args=(pid,), daemon=True,
                                            name="build-watch")
            self._thread.start()

        def ended(pid: int) -> None:
            self._stop.set()
            if self._thread is not None:
                self._thread.join(timeout=10)
            inner["ended"](pid)
        return dict(started=started, ended=ended)

    def _follow(self, pid: int) -> None:
        t0 = last = time.monotonic()
        while not self._stop.wait(self.SAMPLE_S):
            phase = build_phase(_running(pid)) if self.what == "compile" else ""
            now = time.monotonic()
            # (an import runs Python alone: it has no phases). Near the limit the build is being
            # killed: a sample then sees its tools gone and their driver still there.
            if phase and now - t0 < self.limit_s - self.SAMPLE_S / 2:
                self.phase = phase
            if self.check.report is not None and now - last >= self.check.every_s - 0.05:
                last = now
                try:
                    self.check.report(progress_line(self.what, self.source_name, self.phase,
                                                    now - t0, self.limit_s))
                except (OSError, ValueError):   # the display is gone (a closed stderr)
                    pass


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
        subject = Path(__file__).resolve().parent / "subject" / "loop.py"
        cmd = [sys.executable, str(subject), "--check-load",
               json.dumps(dict(kind="python", source=str(sub.source)))]
    else:   # build_submission made sure there is an nvcc
        mode = cuda_mode(device)
        timeout = limits.build_s
        cmd = [sys.executable, "-m", "grader.build", mode, str(sub.source), "--name",
               sub.module_name, "--build-dir", str(build_dir), "--arch", device.arch,
               "--nvcc", device.nvcc]
    # No GPU at all: a build runs beside other submissions' timed calls (a Python submission's
    # import runs its code), and a compile needs none (the architecture is given).
    env = child_env(cuda=device.cuda)
    env["CUDA_VISIBLE_DEVICES"] = ""
    sandbox = sandbox.without_gpus() if sandbox is not None else None
    if sandbox is not None:   # the build sees neither the solution nor anyone else's code
        cmd = sandbox.wrap(cmd, writable=[build_dir], readonly=[sub.path])
    memory = int(limits.build_memory_gb * (1 << 30)) if sub.kind is Kind.CUDA else None
    hooks = QUOTA.hooks(build_dir, spare_root=False)
    if watch is not None:
        hooks = watch.hooks(hooks)
    with QUOTA.watch(build_dir, int(limits.folder_gb * (1 << 30)), limits.folder_files):
        proc = run_limited(cmd, timeout_s=timeout, env=env, cwd=sub.path,
                           head_bytes=limits.output_head_bytes, tail_bytes=limits.output_tail_bytes,
                           memory_bytes=memory,
                           file_bytes=int(limits.file_gb * (1 << 30)),
                           cpus=split_cpus(limits.gpu_stage_cpus).build,   # off the timed calls' CPUs
                           **hooks)
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
    return _interpret(proc, mode, sub, build_dir, timeout,
                      student_check=watch.check if watch is not None else None), proc.output


# A Python submission's import check runs with no GPU (it overlaps other submissions' timed calls
# on a GPU machine, tests/adversarial/import_gpu_hog_py). A file that uses the GPU when imported
# (a device query, a constant on the GPU) fails there with one of these; it is then imported on
# its own GPU worker's GPU by the run stage, whose load error is its first case's verdict.
NEEDS_A_GPU = re.compile(r"No CUDA GPUs are available|no CUDA-capable device|Found no NVIDIA "
                         r"driver|CUDA driver initialization failed|cudaErrorNoDevice|"
                         r"0 active drivers")


def _interpret(proc: ProcResult, mode: str, sub: Submission, build_dir: Path,
               timeout: float, *, student_check: StudentCheck | None = None) -> BuildResult:
    what = "import" if mode == "import" else "compile"
    if proc.timed_out:
        return BuildResult(Status.TIMEOUT, mode, proc.elapsed_s,
                           message=f"{what} did not finish within {timeout:.0f} s",
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


_NO_MODULE = re.compile(r"^(?:ModuleNotFoundError|ImportError): No module named '([\w.]+)'", re.M)
_NO_HEADER = re.compile(r"fatal error: ([\w/.]+\.h): No such file or directory")
_NO_NINJA = "Ninja is required to load C++ extensions"
# gcc's preprocessor (fatal error: cute/tensor.hpp: No such file) and nvcc's front end (cannot
# open source file "cute/tensor.hpp") on an #include of a CUTLASS or CuTe header.
_NO_CUTLASS = re.compile(r"fatal error: (?:cute|cutlass)/[\w/.]+: No such file or directory|"
                         r"cannot open source file \"(?:cute|cutlass)/[\w/.]+\"")


def environment_problem(output: str, mode: str) -> str:
    """What the grading machine lacks, judging by a failed build's output ('' if nothing): a
    module the set-up installs (config.PROVIDED_MODULES), a header it provides, ninja. What the
    output claims is checked against this process's own view, so a submission cannot print its
    way out of a verdict: a module this interpreter can import is not missing."""
    for name in _NO_MODULE.findall(output):
        top = name.split(".")[0]
        if top in config.PROVIDED_MODULES and importlib.util.find_spec(top) is None:
            return (f"lacks the Python module '{top}', which the course's set-up installs "
                    f"(scripts/bootstrap.sh)")
    if mode == "import":
        return ""
    for header in _NO_HEADER.findall(output):
        name = os.path.basename(header)
        if name in config.PROVIDED_HEADERS and not any(
                os.path.isfile(os.path.join(d, name)) for d in cuda_include_dirs() + _cuda_home_include()):
            return (f"lacks the CUDA header {name}, which the set-up provides "
                    f"(scripts/bootstrap.sh fetches it into .venv/cuda-include)")
    if _NO_CUTLASS.search(output) and cutlass_include() is None:
        return (f"lacks the CUTLASS/CuTe headers (cute/..., cutlass/...), which the set-up "
                f"provides: {CUTLASS_INSTALL}")
    if _NO_NINJA in output and shutil.which("ninja") is None:
        return "lacks ninja, which torch's extension builder needs (pip install ninja)"
    return ""


def _cuda_home_include() -> list[str]:
    nvcc = shutil.which("nvcc")
    return [os.path.join(os.path.dirname(os.path.dirname(nvcc)), "include")] if nvcc else []


def _first_error(log: str) -> str:
    """The first compiler error: the line a student should read first. A compiler's diagnostic
    ("error:", "error #20-D:") comes before any other line that says error, and a line of a
    warning never is one (torch's "CUDA initialization: Unexpected error" warning came first in
    the build log of session 15's GPU course)."""
    lines = [l for l in log.splitlines() if not _A_WARNING.search(l)]
    for pattern in (_DIAGNOSTIC, _ANY_ERROR):
        found = next((l for l in lines if pattern.search(l)), None)
        if found is not None:
            return found
    return ""


_DIAGNOSTIC = re.compile(r"\berror\b( #[\w-]+)?\s*:", re.I)
_ANY_ERROR = re.compile(r"\berror\b", re.I)
_A_WARNING = re.compile(r"\w*Warning:|\bwarning( #[\w-]+)?\s*:", re.I)


_CUDA_LOC = re.compile(r"\S*cuda\.cu\((\d+)\)")        # nvcc:  .../cuda.cu(45): error: ...
_GCC_LOC = re.compile(r"\S*cuda\.cu:(\d+)(:\d+)?")       # host compiler: .../cuda.cu:45:3: error


def relevant_log(output: str, source_name: str = "submission.cu", *, errors_only: bool = False,
                 max_lines: int = 60) -> str:
    """Compiler output with paths mapped back to the student's file and line, errors first."""
    shift = len(LOAD_INLINE_PRELUDE)
    text = _CUDA_LOC.sub(lambda m: f"{source_name}:{int(m.group(1)) - shift}", output)
    text = _GCC_LOC.sub(lambda m: f"{source_name}:{int(m.group(1)) - shift}{m.group(2) or ''}", text)
    lines = text.splitlines()
    errors = [i for i, l in enumerate(lines) if re.search(r"\berror\b|Error|Traceback", l)]
    if errors_only:
        warnings = [l for l in lines if re.search(r"\bwarning\b", l) and source_name in l]
        return "\n".join(warnings[:max_lines])
    if not errors:
        return "\n".join(lines[-max_lines:])
    # Each error with the two lines after it (nvcc prints the offending source line there).
    keep: list[str] = []
    for i in errors:
        for line in lines[i:i + 3]:
            if line not in keep[-3:]:
                keep.append(line)
    if len(keep) > max_lines:
        keep = keep[:max_lines] + [f"[... {len(keep) - max_lines} more lines: see the full log ...]"]
    return "\n".join(keep)


# ---------------------------------------------------------------- the child process


# `check --verbose` sets this for the builds it starts: ptxas then reports each kernel's registers,
# spills, stack and shared memory (-Xptxas=-v), in the build log, which check summarises.
PTXAS_VERBOSE_ENV = "GRADER_PTXAS_VERBOSE"


# load_inline's flags besides the architecture's (build_extension); part of every cache key.
EXTRA_CFLAGS = ("-O3",)
EXTRA_CUDA_CFLAGS = ("-O3", "-lineinfo")


# The CUDA driver, linked into every extension for the one thing a kernel's host code needs from it
# that the runtime does not give: encoding TMA tensor maps (cuTensorMapEncodeTiled, for Hopper's bulk
# tensor copies, as FlashAttention-3 and the solution's kernel 6 use them). Without the link, the
# only way to that call is a driver entry-point lookup, which hands out every driver function and is
# flagged (grader/reach.py). What an object may import from the driver is reach.DRIVER_ALLOWED; any
# other driver call stays flagged. The link takes the toolkit's stub (no GPU needed), else the
# installed driver's library; with neither (a machine without CUDA), nothing is linked.
STUB_FOLDERS = ("lib64/stubs", "lib/stubs", "targets/x86_64-linux/lib/stubs",
                "targets/sbsa-linux/lib/stubs")


@functools.lru_cache(maxsize=None)
def driver_ldflags() -> tuple[str, ...]:
    """The linker flags that link the CUDA driver's library; empty where there is none. The stub
    is the one of the toolkit whose nvcc the builds run (device.find_nvcc)."""
    nvcc = find_nvcc()
    home = os.path.dirname(os.path.dirname(os.path.realpath(nvcc))) if nvcc else None
    for sub in STUB_FOLDERS if home else ():
        if os.path.isfile(os.path.join(home, sub, "libcuda.so")):
            return (f"-L{os.path.join(home, sub)}", "-lcuda")
    for folder in _driver_folders():
        if os.path.isfile(os.path.join(folder, "libcuda.so.1")):
            return (f"-L{folder}", "-l:libcuda.so.1")
    return ()


def _driver_folders() -> list[str]:
    """Where the dynamic linker finds the installed driver's libcuda.so.1 (ldconfig's cache),
    then the usual places."""
    found = []
    ldconfig = shutil.which("ldconfig") or ("/sbin/ldconfig" if os.path.exists("/sbin/ldconfig") else None)
    if ldconfig:
        try:
            out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        found = [os.path.dirname(line.split("=>", 1)[1].strip()) for line in out.splitlines()
                 if line.strip().startswith("libcuda.so.1 ") and "=>" in line and "x86-64" in line]
    return found + ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/local/nvidia/lib64",
                    "/usr/lib/wsl/lib"]


def arch_flags(arch: str) -> list[str]:
    """The flags that decide the device code (one architecture, the GPU's own, or the course
    GPU's without one) and, with PTXAS_VERBOSE_ENV set, ptxas's report on it."""
    verbose = ["-Xptxas=-v"] if os.environ.get(PTXAS_VERBOSE_ENV) == "1" else []
    return [f"-gencode=arch=compute_{arch},code=sm_{arch}", *verbose]


def build_extension(source: Path, name: str, build_dir: Path, arch: str,
                    extra_cuda_cflags: list[str] = ()) -> Path:
    """load_inline exactly as a CS149-style wrapper calls it, except that the module is built and
    not imported: importing runs its static initializers, and none of a submission's code may run
    before the grader has read what it built (grader/reach.py audits the object file). Returns
    the built module's path."""
    from torch.utils import cpp_extension
    if not hasattr(cpp_extension, "_import_module_from_library"):
        raise SystemExit("this torch's load_inline has no _import_module_from_library: the grader "
                         "cannot build without importing; update grader/build.py")
    cpp_extension._import_module_from_library = lambda name, path, is_python_module: path
    # torch's ninja rule then has nvcc write the unit's dependency list, which ninja keeps
    # (.ninja_deps): the headers the audit reads (main, record_headers).
    os.environ["TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES"] = "0"
    build_dir.mkdir(parents=True, exist_ok=True)
    cpp_extension.load_inline(name=name, cpp_sources=[config.ENTRY_DECLARATION],
                              cuda_sources=[source.read_text()], functions=[config.ENTRY_POINT],
                              build_directory=str(build_dir), verbose=True,
                              extra_include_paths=cutlass_include_dirs(),
                              extra_cflags=list(EXTRA_CFLAGS),
                              extra_cuda_cflags=[*EXTRA_CUDA_CFLAGS, *arch_flags(arch),
                                                 *extra_cuda_cflags],
                              extra_ldflags=list(driver_ldflags()))
    path = build_dir / f"{name}.so"
    print(f"built {path}")
    return path


# CUTLASS and CuTe (header-only C++ templates) for the CuTe track: the `nvidia-cutlass` wheel,
# which scripts/bootstrap.sh installs (pyproject's `cute` extra, without its Python dependencies),
# ships them in its cutlass_library package, as source/include/{cute,cutlass}. That folder is on
# the include path of every CUDA build (the extension and the compile check); a plain CUDA
# submission never notices it. The wheel lives in the virtual environment or the interpreter's
# site-packages, which the sandbox shows read-only (sandbox.default_layout).
CUTLASS_DIST = "nvidia-cutlass"
CUTLASS_INSTALL = "pip install --no-deps 'nvidia-cutlass==4.2.0' (scripts/bootstrap.sh does)"


@functools.lru_cache(maxsize=None)
def cutlass_include() -> str | None:
    """The folder holding cute/ and cutlass/ (the nvidia-cutlass wheel's headers), or None where
    the wheel is not installed. Found from the distribution's metadata: nothing is imported."""
    import importlib.metadata as md
    try:
        dist = md.distribution(CUTLASS_DIST)
    except md.PackageNotFoundError:
        return None
    folder = Path(str(dist.locate_file("cutlass_library/source/include")))
    return str(folder) if (folder / "cute" / "tensor.hpp").is_file() \
        and (folder / "cutlass" / "version.h").is_file() else None


@functools.lru_cache(maxsize=None)
def cutlass_identity() -> dict | None:
    """What of CUTLASS a build sees, for the cache key: the wheel's version, the version its
    headers declare, where they are and every header's path, size and time. None without it."""
    folder = cutlass_include()
    if folder is None:
        return None
    import importlib.metadata as md
    declared = re.findall(r"#define\s+CUTLASS_(MAJOR|MINOR|PATCH)\s+(\d+)",
                          (Path(folder) / "cutlass" / "version.h").read_text(errors="replace"))
    return dict(dist=md.version(CUTLASS_DIST), headers=".".join(v for _, v in declared),
                include=folder, digest=headers_digest((folder,)))


def cutlass_include_dirs() -> list[str]:
    """The CUTLASS/CuTe include folder, as a list: empty where the wheel is missing."""
    folder = cutlass_include()
    return [folder] if folder else []


def cuda_include_dirs() -> list[str]:
    """Headers a compile check needs that a bare CUDA install may lack (cuBLAS, cuSPARSE,
    cuSOLVER: ATen/cuda/CUDAContext.h includes them). scripts/bootstrap.sh extracts them."""
    dirs = [os.environ.get("GRADER_CUDA_INCLUDE"), str(config.REPO_ROOT / ".venv" / "cuda-include")]
    return [d for d in dirs if d and os.path.isdir(d)]


# The compile check (no GPU) compiles the same translation unit as the real build, with the same
# flags, except that the student's `#include <torch/extension.h>` finds CHECK_EXTENSION_H first:
# torch's tensor API without the parts of extension.h that a kernel file does not use, the Python
# binding (pybind11; load_inline's wrapper supplies it) and the C++ frontend (torch::nn, optim,
# data, serialize, jit). That halves what nvcc parses, twice over (cudafe++ and cicc), and the host
# compile. A failure that could come from the parts left out is compiled again with the real
# extension.h (check_error_is_own), so a file is never called broken that the real build accepts.
CHECK_EXTENSION_H = """#pragma once
// The grader's compile check: torch/extension.h without the Python binding and the C++ frontend.
#include <torch/types.h>
#include <torch/utils.h>
#include <torch/cuda.h>
"""
_NOT_OWN = re.compile(r"\b(?:torch|at|c10|caffe2|pybind11|py|PYBIND11_\w*|TORCH_\w*|C10_\w*|AT_\w*)\b")
_USING = re.compile(r"\busing\s+namespace\s+(?:torch|at|c10|pybind11|py)\b|\bnamespace\s+py\s*=")


def check_error_is_own(output: str, source: str) -> bool:
    """Whether a failed compile check's errors are the file's own whatever torch headers it sees:
    every error is in the file itself (cuda.cu), none names torch, ATen, c10 or pybind11 (a name
    that the full extension.h might declare), and the file does not pull those namespaces in
    (then any undeclared name could be theirs)."""
    if _USING.search(source):
        return False
    errors = [l for l in output.splitlines() if re.search(r"\berror\b", l)]
    if not errors:
        return False
    for line in errors:
        if not (_CUDA_LOC.search(line) or _GCC_LOC.search(line)) or _NOT_OWN.search(line):
            return False
    return True


def compile_check_command(unit: Path, obj: Path, name: str, arch: str, nvcc: str,
                          first_include: list[str] = (), depfile: Path | None = None) -> list[str]:
    """nvcc's command for the compile check: load_inline's flags for a CUDA source (torch's
    COMMON_NVCC_FLAGS, the C++ standard and ABI of this torch, -O3, one architecture), and, with
    a `depfile`, nvcc's list of every file the unit opened (-MD -MF, as torch's ninja rule asks)."""
    import torch
    from torch.utils.cpp_extension import COMMON_NVCC_FLAGS, include_paths
    std = "-std=c++20" if tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 10) else "-std=c++17"
    cmd = [nvcc, "-c", str(unit), "-o", str(obj), std, "-O3",
           f"-DTORCH_EXTENSION_NAME={name}", "-DTORCH_API_INCLUDE_EXTENSION_H",
           "-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE",   # the CPU build of torch lacks this generated header
           f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
           "-Xcompiler", "-fPIC", *COMMON_NVCC_FLAGS, *arch_flags(arch)]
    if depfile is not None:
        cmd += ["-MD", "-MF", str(depfile)]
    for inc in [*first_include, *include_paths(), *cuda_include_dirs(), *cutlass_include_dirs(),
                sysconfig.get_paths()["include"]]:
        cmd += ["-I", inc]
    return cmd


def _compile_only(source: Path, name: str, build_dir: Path, arch: str, nvcc: str) -> None:
    import subprocess
    import time
    text = source.read_text()
    unit = build_dir / "cuda.cu"
    unit.write_text("\n".join(LOAD_INLINE_PRELUDE + [text]))
    obj, depfile = build_dir / STUDENT_OBJECT, build_dir / DEPFILE
    shim = build_dir / "check-include"
    (shim / "torch").mkdir(parents=True, exist_ok=True)
    (shim / "torch" / "extension.h").write_text(CHECK_EXTENSION_H)
    print(f"compile check for sm_{arch} (no GPU here: compiled, not run)", flush=True)
    cmd = compile_check_command(unit, obj, name, arch, nvcc, [str(shim)], depfile)
    print(" ".join(cmd), flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace")
    if proc.returncode == 0 or check_error_is_own(proc.stdout, text):
        print(proc.stdout, end="", flush=True)
        print(f"compile check: {time.monotonic() - t0:.1f} s", flush=True)
        _exit_recorded(proc.returncode, build_dir, lambda: _depfile_headers(depfile), "nvcc -MD",
                       base=Path.cwd())
    # Only the second compile's output is shown: the student reads each message once.
    print(f"compile check: failed in {time.monotonic() - t0:.1f} s in a way that may involve "
          f"torch's headers; compiling again with the full torch/extension.h, as the real build "
          f"does", flush=True)
    obj.unlink(missing_ok=True)
    depfile.unlink(missing_ok=True)
    cmd = compile_check_command(unit, obj, name, arch, nvcc, depfile=depfile)
    print(" ".join(cmd), flush=True)
    _exit_recorded(subprocess.run(cmd).returncode, build_dir, lambda: _depfile_headers(depfile),
                   "nvcc -MD", base=Path.cwd())


def _exit_recorded(returncode: int, build_dir: Path, headers, how: str, *, base: Path) -> None:
    """End the build child: after a compile that passed, with the record of the headers it opened
    written (record_headers). A record that cannot be made is the machine's problem, not the
    student's: the child says why and still exits as the compile did, and the grader, finding no
    record, calls the build an environment error (with_kernels)."""
    if returncode == 0:
        try:
            record_headers(build_dir, headers(), how=how, base=base)
        except (OSError, ValueError, RuntimeError, subprocess.SubprocessError) as e:
            print(f"grader: no record of the headers the build opened: {e}", flush=True)
    sys.exit(returncode)


def record_headers(build_dir: Path, headers: list[str], *, how: str, base: Path) -> None:
    """Write HEADERS_RECORD beside STUDENT_OBJECT: the real path of every file the compiler opened
    for the submission's translation unit (the unit itself first), as it opened them.

    Why the record can be trusted although the build child runs in the submission's sandbox:
    nothing of the submission runs there. Its source is compiled, never run (the module is built,
    not imported: build_extension), and a compiler reads files, it runs none of them. The list is
    what the preprocessor opened, not what the text says: every spelling of an #include
    (`<cutlass//gemm/...>`, `..`, an absolute path, a line continuation, a macro) is the file it
    opens, and a GNU line marker in the source (`# 1 "cute/tensor.hpp" 1`), which changes the
    names diagnostics, `-H` and the preprocessed markers show, adds or hides nothing here
    (tests/test_native_audit.py). nvcc's list covers both its passes, the device code's and the
    host code's. Paths are resolved here, in the view of the files the compiler had (a relative
    one against `base`, the folder the compiler ran in)."""
    if not headers:
        raise ValueError("the compiler listed no file")
    real = [os.path.realpath(os.path.join(base, h)) for h in headers]
    record = dict(schema=HEADERS_SCHEMA, object=STUDENT_OBJECT, how=how, headers=real)
    (build_dir / HEADERS_RECORD).write_text(json.dumps(record, indent=0))


def _depfile_headers(depfile: Path) -> list[str]:
    """nvcc's dependency list, read and then removed (the record holds what is needed)."""
    paths = depfile_paths(depfile.read_text(errors="surrogateescape"))
    depfile.unlink()
    return paths


def depfile_paths(text: str) -> list[str]:
    """The prerequisites of the first rule of a make-style dependency file (gcc's and nvcc's -MD
    output): after its target's colon, split on whitespace that no backslash escapes; `\\ ` is a
    space, `\\#` a hash, `$$` a dollar, and a backslash that ends a line continues it."""
    rule = re.sub(r"\\\r?\n", " ", text).split("\n", 1)[0]
    colon = re.search(r":(?=\s|$)", rule)
    if colon is None:
        raise ValueError("not a dependency file (no target)")
    tokens = re.findall(r"(?:\\[ #\t]|\$\$|\\(?![ #\t])|[^\s\\])+", rule[colon.end():])
    return [re.sub(r"\\([ #\t])|\$(\$)", lambda m: m.group(1) or m.group(2), t) for t in tokens]


def ninja_deps(build_dir: Path, target: str = STUDENT_OBJECT) -> list[str]:
    """What ninja recorded of the files `target`'s compile opened (`ninja -t deps`): torch's rule
    for a CUDA source has nvcc write a dependency file (-MD -MF), which ninja reads into its
    .ninja_deps and deletes. Paths are as ninja keeps them (relative to the build folder or
    absolute)."""
    ninja = shutil.which("ninja")
    if ninja is None:
        raise RuntimeError("ninja is not on PATH")
    proc = subprocess.run([ninja, "-C", str(build_dir), "-t", "deps", target],
                          capture_output=True, text=True, errors="surrogateescape", timeout=120)
    lines = proc.stdout.splitlines()
    if proc.returncode != 0 or not lines or not re.match(rf"{re.escape(target)}: #deps \d+", lines[0]):
        raise RuntimeError(f"ninja keeps no dependency record of {target} (torch's build rule asked "
                           f"for none?): {(proc.stdout or proc.stderr).strip()[:300]}")
    return [line.strip() for line in lines[1:] if line.strip()]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m grader.build")
    p.add_argument("mode", choices=["extension", "compile_only"])
    p.add_argument("source", type=Path)
    p.add_argument("--name")
    p.add_argument("--build-dir", type=Path)
    p.add_argument("--arch", default=config.DEFAULT_CUDA_ARCH)
    p.add_argument("--nvcc")
    p.add_argument("--cuda-flag", action="append", default=[],
                   help="extra nvcc flag for 'extension' builds (benchmarks: -DNAME=VALUE, -Xptxas=-v)")
    a = p.parse_args(argv)
    # torch asks for the GPUs when the extension builder loads, and a build has none (its address
    # space is capped, its sandbox has no GPU): its warning is not the student's error.
    warnings.filterwarnings("ignore", message="CUDA initialization", category=UserWarning)
    if a.mode == "extension":
        build_extension(a.source, a.name, a.build_dir, a.arch, a.cuda_flag)
        _exit_recorded(0, a.build_dir, lambda: ninja_deps(a.build_dir), "ninja -t deps",
                       base=a.build_dir)
    else:
        _compile_only(a.source, a.name, a.build_dir, a.arch, a.nvcc)


if __name__ == "__main__":
    main()

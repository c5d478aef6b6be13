"""What a submission's GPU stages see and write: its folder and build folder (read-only), its JIT
cache folder (jit_cache: written, watched by quota), its work folder on scratch, and the logs the
instructor reads."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

from grader.build.ahead import seed_jit_folder
from grader.common import config
from grader.common.text import clean, clean_line
from grader.course.results import write_json_atomic
from grader.course.runs import scratch_dir
from grader.course.submission import Kind, Role, Submission, source_text
from grader.course.verdicts import BuildResult
from grader.isolation.quota import QUOTA
from grader.isolation.sandbox import give_to_sandbox
from grader.stages.context import GradeContext


SUBJECT = config.GRADER_DIR / "subject" / "loop.py"


# What an autotuner keeps of its choice in a JIT cache folder (Triton's autotune(cache_results)).
TUNING_FILES = ("*.autotune.json",)


def forget_tuning(jit: Path | None) -> None:
    """An autotuner's choice, measured in a run stage that shared the GPU with other submissions'
    (and so slowed by them, or on purpose by one of them), is not kept for the time stage: its
    subject tunes again in its warm-up calls, alone. Compiled kernels stay."""
    if jit is None:
        return
    for pattern in TUNING_FILES:
        for path in jit.rglob(pattern):
            with contextlib.suppress(OSError):
                path.unlink()


def subject_folders(sub: Submission, build: BuildResult | None) -> list[Path]:
    """What a submission's run and timing processes see of the grader's disk, read-only: its own
    folder and its build folder."""
    if sub.kind is Kind.CUDA and build is not None and build.artifact:
        return [sub.path, Path(build.artifact).parent]
    return [sub.path]


# JIT compilers' caches (Triton's, TileLang's): one folder per submission, written by its run and
# timing processes and seen by no other submission's. The sandbox gives each process a fresh $HOME,
# so the timing process compiled every kernel again: about 8 s of a Triton submission's 28 s
# timing stage on an H100 (session 8, notes/throughput.md). Without the sandbox, submissions shared
# ~/.triton/cache, where one could leave a compiled kernel for another to load. The folder is as
# exposed as a Python submission's build folder is to its import check: writable, on scratch.
JIT_CACHE_VARS = {"TRITON_CACHE_DIR": "triton", "TILELANG_CACHE_DIR": "tilelang"}


@contextlib.contextmanager
def jit_cache(sub: Submission, limits: config.Limits, build: BuildResult | None = None):
    """The submission's JIT cache folder for its GPU stages (None for a CUDA build), watched
    (grader/isolation/quota.py: the harnesses given it attach), removed after. Its Triton cache
    starts with what the build compiled ahead (BuildResult.compiled_ahead, build/ahead.py)."""
    if sub.kind is not Kind.PYTHON:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix=f"jit-{sub.module_name}-", dir=scratch(1 << 30)) as tmp, \
            QUOTA.watch(Path(tmp), int(limits.folder_gb * (1 << 30)), limits.folder_files):
        folder = Path(tmp)
        for name in JIT_CACHE_VARS.values():
            (folder / name).mkdir()
        if build is not None:
            seed_jit_folder(build.compiled_ahead, folder / JIT_CACHE_VARS["TRITON_CACHE_DIR"])
        SEEDED[str(folder)] = _jit_files(folder)
        give_to_sandbox(folder)   # written as the sandbox's user
        try:
            yield folder
        finally:
            SEEDED.pop(str(folder), None)


# What each live JIT folder held when its GPU stages began (its Triton kernels and launchers),
# for jit_report: whether what the build compiled was what the run looked up.
SEEDED: dict[str, tuple[set, set]] = {}


def _jit_files(jit: Path) -> tuple[set, set]:
    """The Triton kernels (cubins) and native launchers (Triton before 3.7 builds one per kernel
    signature) in a JIT folder, each as (path, inode): a file Triton wrote again in the turn (a
    cache miss compiles into the same key folder, replacing the file) is a new one."""
    triton = jit / JIT_CACHE_VARS["TRITON_CACHE_DIR"]

    def files(pattern: str) -> set:
        return {(str(p.relative_to(triton)), p.stat().st_ino) for p in triton.glob(pattern)}
    try:
        return files("*/*.cubin"), files("*/*launcher*.so")
    except OSError:
        return set(), set()


def jit_report(jit: Path | None) -> str:
    """One line for the instructor's run log: how many Triton kernels and launchers the
    submission's GPU stages found built in its build, and how many they built in their turn ('' for
    no JIT folder). Issue 32: the build's compile ahead pays only where the turn built none."""
    if jit is None or str(jit) not in SEEDED:
        return ""
    (kernels, launchers), (kernels_now, launchers_now) = SEEDED[str(jit)], _jit_files(jit)
    if not kernels and not kernels_now:
        return ""
    return (f"grader: Triton kernels: {len(kernels)} compiled in the build, "
            f"{len(kernels_now - kernels)} compiled in the GPU stages' turn; launchers: "
            f"{len(launchers)} built in the build, {len(launchers_now - launchers)} in the turn\n")


def jit_env(env: dict, jit: Path) -> dict:
    """A subject's environment with its JIT caches in `jit`."""
    return {**env, **{var: str(jit / name) for var, name in JIT_CACHE_VARS.items()}}


def read_source_text(sub: Submission) -> str | None:
    """The submission's file, for its hint (submission.source_text: never blocks, capped)."""
    return source_text(sub) if sub.kind is not Kind.INVALID else None


def label_of(sub: Submission) -> str:
    return "Reference solution" if sub.role is Role.BASELINE else clean_line(sub.id)


def work_folder(sub: Submission) -> tempfile.TemporaryDirectory:
    """A submission's GPU stages' folder (its spec files, outputs and records), removed after."""
    return tempfile.TemporaryDirectory(prefix=f"grade-{sub.module_name}-", dir=scratch())


def scratch(need_bytes: int = 8 << 30) -> str | None:
    """Outputs are large (512 MiB on the largest case): keep them in memory where there is room
    (/dev/shm is often a small tmpfs in containers), else in the default temporary folder; inside
    a run, in the run's own scratch folder there, which nothing outlives (grader/course/runs.py)."""
    return scratch_dir(need_bytes)


def save_log(ctx: GradeContext, name: str, stage: str, output: str) -> None:
    path = ctx.out_dir / "logs" / f"{name}.{stage}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(clean(output, limit=1 << 22))


def save_calls(ctx: GradeContext, name: str, record: dict) -> None:
    """Each timed call's time as ranked (ms, in call order) and the subject's own events around
    it, for the instructor's logs and `make bench-grader` (how the median settles with the
    number of calls); no page shows them."""
    path = ctx.out_dir / "logs" / f"{name}.time.calls.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, dict(times_ms=record["times_ms"],
                                 events_ms=[c[1] for c in record.get("calls") or []]))


def target_of(sub: Submission, build: BuildResult | None) -> dict:
    if sub.kind is Kind.CUDA:
        return dict(kind="cuda", artifact=build.artifact, module_name=sub.module_name)
    if sub.kind is Kind.PYTHON:
        return dict(kind="python", source=str(sub.source))
    return dict(kind="builtin", name=sub.id)

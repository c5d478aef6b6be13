"""A Triton submission's kernels compiled in its build, off the GPU (issue 32): compile_ahead runs
grader/subject/ahead.py in the build's sandbox, with no GPU, on the builds' CPUs, and keeps the
Triton cache it filled (BuildResult.compiled_ahead); the submission's GPU stages start from a copy
of it (seed_jit_folder, folders.jit_cache). Its run stage then loads its kernels instead of
compiling them while the GPU waits: about 4 of a Triton copy's 5 s run stage (notes/throughput.md,
session 23).

The invariant: **what was compiled ahead changes nothing but how long a run stage compiles.**
- It runs with no GPU at all (the sandbox's device nodes, CUDA_VISIBLE_DEVICES=""): like a
  Python submission's import check it runs beside other submissions' timed calls, so it must not
  load their GPU.
- Its outcome is never a verdict: a failure, a timeout or a folder over its limits keeps nothing,
  and the run stage compiles as before. The build's verdict is the import check's.
- What is kept is what the submission's own run stage could have written into its own JIT folder:
  regular files of Triton's cache, no links, no devices, no autotuner's choices (measured
  nowhere), within AHEAD_KEEP_FILES and AHEAD_KEEP_BYTES; the folder is another submission's
  never. That includes Triton's native launchers (built by Triton from its own generated C with
  the host's compiler): only the submission's own processes load anything from its JIT folder,
  and they may write any file there in their turn, so a library kept from the build gives the
  submission nothing its turn does not already have.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import stat
import sys
import time
from pathlib import Path

from grader.build.cache import empty_folder
from grader.common import config
from grader.common.status import Status
from grader.course.submission import Kind, Submission, source_text
from grader.course.verdicts import BuildResult
from grader.isolation.cpus import build_priority, split_cpus
from grader.isolation.device import DeviceInfo
from grader.isolation.procs import child_env, run_limited
from grader.isolation.quota import QUOTA
from grader.isolation.sandbox import Sandbox, give_to_sandbox
from grader.problem import Case

AHEAD_FOLDER = "ahead"   # in the submission's build folder: Triton's cache under it, "triton"
# What is kept of it (Triton's cache of one kernel is a few files of a few hundred KB).
AHEAD_KEEP_FILES = 500
AHEAD_KEEP_BYTES = 64 << 20
# Files of Triton's cache never kept: an autotuner's choice (its timings were taken with no GPU).
NOT_KEPT = (".autotune.json",)
# Triton's group files: which files make up one kernel, by absolute path (seed_jit_folder, regrouped).
GROUP_PREFIX = "__grp__"
GROUP_BYTES = 1 << 20   # a group file is a few hundred bytes of JSON: one past this is not one
# The child stops calling this long before it is killed, so that what it compiled is written whole.
AHEAD_STOP_S = 5.0


def wanted(sub: Submission, build: BuildResult, device: DeviceInfo, cases: list[Case],
           limits: config.Limits) -> bool:
    """Whether compile_ahead runs for `sub`: a Python submission that mentions Triton, its import
    check passed, a GPU to compile for, and compiling ahead not turned off (GRADER_AHEAD_S=0)."""
    return (sub.kind is Kind.PYTHON and build.status is Status.PASS and device.cuda
            and bool(device.capability) and bool(cases) and limits.ahead_s > 0
            and "triton" in (source_text(sub) or ""))


def compile_ahead(sub: Submission, build: BuildResult, *, build_dir: Path, device: DeviceInfo,
                  limits: config.Limits, sandbox: Sandbox | None, cases: list[Case],
                  log_path: Path | None = None) -> BuildResult:
    """`build`, with compiled_ahead naming the folder of the Triton cache its kernels were
    compiled into for each of `cases`' shapes, when any was; `build` itself otherwise. Never
    changes its verdict. The seconds it took are added to the build's."""
    if not wanted(sub, build, device, cases, limits):
        return build
    build_dir = build_dir.resolve()
    folder = build_dir / AHEAD_FOLDER
    empty_folder(folder)
    (folder / "triton").mkdir(parents=True, exist_ok=True)
    give_to_sandbox(build_dir)
    limit_s = limits.ahead_s * limits.load_scale
    # The child stops calling at `deadline` (CLOCK_MONOTONIC, one clock machine-wide) and is
    # killed at limit_s: its start, torch's import and the submission's count.
    request = dict(target=dict(kind="python", source=str(sub.source)),
                   shapes=[list(c.shape) for c in cases],
                   capability=device.capability[0] * 10 + device.capability[1],
                   deadline=time.monotonic() + max(0.0, limit_s - AHEAD_STOP_S))
    cmd = [sys.executable, str(config.GRADER_DIR / "subject" / "loop.py"), "--compile-ahead",
           json.dumps(request)]
    env = child_env(cuda=True)
    env["CUDA_VISIBLE_DEVICES"] = ""   # and the sandbox has no GPU node: see the invariant
    env.pop("TRITON_INTERPRET", None)  # compiled for the GPU, not interpreted
    env["TRITON_CACHE_DIR"] = str(folder / "triton")
    split = split_cpus(limits.gpu_stage_cpus)
    nice = build_priority(limits.build_nice, gpu=True, split=split)
    if sandbox is not None:
        cmd = sandbox.without_gpus().wrap(cmd, writable=[build_dir], readonly=[sub.path], nice=nice)
    started = time.monotonic()
    with QUOTA.watch(build_dir, int(limits.folder_gb * (1 << 30)), limits.folder_files):
        proc = run_limited(cmd, timeout_s=limit_s, env=env,
                           cwd=sub.path, head_bytes=limits.output_head_bytes,
                           tail_bytes=limits.output_tail_bytes,
                           file_bytes=int(limits.file_gb * (1 << 30)),
                           cpus=split.build, nice=nice,
                           **QUOTA.hooks(build_dir, spare_root=False))
        over = QUOTA.over(build_dir)
    elapsed = time.monotonic() - started
    kept = keepable(folder / "triton") if over is None and proc.ok else None
    if kept is None:
        empty_folder(folder)
    why = ("over its folder's limits" if over is not None else
           f"stopped at its limit, {limit_s:.0f} s" if proc.timed_out else
           f"it exited with {proc.returncode}" if not proc.ok else
           "not kept: more than its limits, or not only files" if kept is None else
           f"kept {kept[0]} files, {kept[1]} bytes")
    _log(log_path, f"\n[compiled ahead, with no GPU, in {elapsed:.1f} s: {why}]\n{proc.output}")
    if kept is None or not kept[0]:
        return dataclasses.replace(build, elapsed_s=build.elapsed_s + elapsed)
    return dataclasses.replace(build, elapsed_s=build.elapsed_s + elapsed,
                               compiled_ahead=str(folder / "triton"))


def keepable(folder: Path) -> tuple[int, int] | None:
    """(files, bytes) of what seed_jit_folder would copy from `folder`; None when anything in it
    is not a folder or a regular file, or it holds more than AHEAD_KEEP_FILES or
    AHEAD_KEEP_BYTES (then nothing of it is used)."""
    files = size = 0
    try:
        for root, dirs, names, root_fd in os.fwalk(folder, follow_symlinks=False):
            for name in dirs + names:
                st = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    continue
                if not stat.S_ISREG(st.st_mode):
                    return None
                if not name.endswith(NOT_KEPT):
                    files, size = files + 1, size + st.st_size
                if files > AHEAD_KEEP_FILES or size > AHEAD_KEEP_BYTES:
                    return None
    except OSError:
        return None
    return files, size


def seed_jit_folder(seed: str | None, jit_triton: Path) -> int:
    """Copy what was compiled ahead (`seed`: BuildResult.compiled_ahead) into a run's fresh
    Triton cache folder: regular files only, never a link or what NOT_KEPT names, within the
    limits keepable checks again (the folder is looked at anew: nothing of it is trusted from
    the build); Triton's group files name the copies (regrouped). Returns the number of files
    copied (0 when nothing is usable)."""
    if not seed or keepable(Path(seed)) is None:
        return 0
    copied = 0
    for root, dirs, names, root_fd in os.fwalk(seed, follow_symlinks=False):
        rel = Path(root).relative_to(seed)
        for name in names:
            if name.endswith(NOT_KEPT):
                continue
            source = Path(root) / name
            if not stat.S_ISREG(os.lstat(source).st_mode):
                continue
            (jit_triton / rel).mkdir(parents=True, exist_ok=True)
            with open(source, "rb", opener=_no_follow) as src:
                if not name.startswith(GROUP_PREFIX):
                    with open(jit_triton / rel / name, "wb") as dst:
                        shutil.copyfileobj(src, dst)
                    copied += 1
                    continue
                data = regrouped(src.read(GROUP_BYTES + 1), jit_triton / rel)
            if data is None:   # not Triton's (or larger than any of its groups): compiled in its turn
                continue
            (jit_triton / rel / name).write_bytes(data)
            copied += 1
    return copied


def regrouped(data: bytes, folder: Path) -> bytes | None:
    """One of Triton's group files (`__grp__NAME.json`: {"child_paths": {file: absolute path}}),
    its paths moved into `folder`, the copy's own key folder. Triton looks a kernel up by those
    paths, and the build folder they name is not in the run's sandbox: a group copied unchanged
    made every kernel compiled ahead a cache miss, compiled again in the turn (session 25's
    course). Each path becomes that of the same file name in `folder`, so a group names nothing
    outside its own key folder. None when `data` is not such a group."""
    try:
        group = json.loads(data)
        paths = group["child_paths"]
        moved = {str(child): str(folder / Path(str(path)).name) for child, path in paths.items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return json.dumps({**group, "child_paths": moved}).encode()


def _no_follow(path, flags):
    return os.open(path, flags | os.O_NOFOLLOW)


def _log(log_path: Path | None, text: str) -> None:
    if log_path is None:
        return
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8", errors="replace") as f:
        f.write(text)

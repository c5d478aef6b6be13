"""The build child, run as `python -m grader.build.stage` (its entry point, main, is here): builds
the extension with load_inline without importing it (build_extension), or, with no GPU,
compile-checks the source with nvcc (_compile_only, compile_check_command, check_error_is_own),
then records the headers the compile opened (headers.py).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import warnings
from pathlib import Path

from grader.common import config
from grader.trusted.audit.reach import STUDENT_OBJECT
from grader.build.flags import (EXTRA_CFLAGS, EXTRA_CUDA_CFLAGS, LOAD_INLINE_PRELUDE, arch_flags,
                                cuda_include_dirs, cutlass_include_dirs, driver_ldflags)
from grader.build.log import _CUDA_LOC, _GCC_LOC
from grader.build.headers import DEPFILE, _depfile_headers, _exit_recorded, ninja_deps


def build_extension(source: Path, name: str, build_dir: Path, arch: str,
                    extra_cuda_cflags: list[str] = ()) -> Path:
    """load_inline exactly as a CS149-style wrapper calls it, except that the module is built and
    not imported: importing runs its static initializers, and none of a submission's code may run
    before the grader has read what it built (grader/trusted/audit/reach.py audits the object
    file). Returns the built module's path.

    The submission's unit is compiled first against torch's tensor API alone, as the compile
    check compiles it (CHECK_EXTENSION_H found first for its `#include <torch/extension.h>`; the
    binding, main.cpp, still sees the real one): on the reference solution that is about half of
    nvcc's work (notes/check_speed.md), and the CUDA builds' CPU is what bounds a course's end
    (notes/throughput.md, session 27). If that compile fails for any reason, its output is
    dropped and the unit is compiled again with the full extension.h, as load_inline alone
    would: no file is called broken that load_inline accepts, and the student reads only the
    real build's messages. Both compiles count against the one build limit, so a file that names
    what only the full header declares (NEEDS_FULL_HEADER) gets the full header at once."""
    if NEEDS_FULL_HEADER.search(source.read_text()):
        path = _load_inline(source, name, build_dir, arch, list(extra_cuda_cflags))
    else:
        path = _tensor_api_first(source, name, build_dir, arch, list(extra_cuda_cflags))
    print(f"built {path}")
    return path


def _tensor_api_first(source: Path, name: str, build_dir: Path, arch: str,
                      extra_cuda_cflags: list[str]) -> Path:
    """build_extension's two compiles: against CHECK_EXTENSION_H, its output kept aside and shown
    if it passes; else again with the full header, its output shown as it comes."""
    shim = check_include(build_dir)
    first = build_dir / "tensor-api-compile.log"
    try:
        with _stdout_to(first):
            path = _load_inline(source, name, build_dir, arch, [*extra_cuda_cflags, f"-I{shim}"])
    except (RuntimeError, subprocess.SubprocessError):
        # (No "error" in this line: the build's first error is the line a student reads first.)
        print(f"build: compiling {source.name} again with the full torch/extension.h: it did not "
              f"compile against torch's tensor API alone", flush=True)
        path = _load_inline(source, name, build_dir, arch, extra_cuda_cflags)
    else:
        sys.stdout.flush()
        with open(first, "rb") as f:   # the compilers' output, as they wrote it
            shutil.copyfileobj(f, sys.stdout.buffer)
        sys.stdout.buffer.flush()
    first.unlink(missing_ok=True)
    return path


def _load_inline(source: Path, name: str, build_dir: Path, arch: str,
                 extra_cuda_cflags: list[str]) -> Path:
    from torch.utils import cpp_extension
    if not hasattr(cpp_extension, "_import_module_from_library"):
        raise SystemExit("this torch's load_inline has no _import_module_from_library: the grader "
                         "cannot build without importing; update grader/build/child.py")
    cpp_extension._import_module_from_library = lambda name, path, is_python_module: path
    # A second load_inline of `name` in this process with other flags (build_extension's second
    # compile) would be renamed <name>_v1 by torch's versioner: each call here is the first.
    entries = getattr(getattr(cpp_extension, "JIT_EXTENSION_VERSIONER", None), "entries", None)
    if not isinstance(entries, dict):
        raise SystemExit("this torch's cpp_extension has no JIT_EXTENSION_VERSIONER.entries: the "
                         "grader cannot compile a module twice under one name; update "
                         "grader/build/child.py")
    entries.pop(name, None)
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
    return build_dir / f"{name}.so"


@contextlib.contextmanager
def _stdout_to(path: Path):
    """This process's standard output, file descriptor 1 (where load_inline's ninja writes the
    compilers' output), into `path` for the block's duration."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(path, "wb") as f:
            os.dup2(f.fileno(), 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


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
# What the full extension.h declares and CHECK_EXTENSION_H does not: the Python binding and the
# C++ frontend. A unit that names them is built with the full header from the start.
NEEDS_FULL_HEADER = re.compile(r"\b(?:py|pybind11)::|\bPYBIND11_|\bPyObject\b|\bPy_\w|"
                               r"\btorch::(?:nn|optim|data|jit|serialize|python)\b")


def check_include(build_dir: Path) -> Path:
    """The folder whose torch/extension.h is CHECK_EXTENSION_H, in `build_dir`, for -I."""
    shim = build_dir / "check-include"
    (shim / "torch").mkdir(parents=True, exist_ok=True)
    (shim / "torch" / "extension.h").write_text(CHECK_EXTENSION_H)
    return shim


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
    text = source.read_text()
    unit = build_dir / "cuda.cu"
    unit.write_text("\n".join(LOAD_INLINE_PRELUDE + [text]))
    obj, depfile = build_dir / STUDENT_OBJECT, build_dir / DEPFILE
    shim = check_include(build_dir)
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


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m grader.build.stage")
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

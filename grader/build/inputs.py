"""The build cache's key (build_inputs): everything that decides the files a CUDA build leaves, its
mode (cuda_mode), the compilers' version reports (toolchain), the environment they read
(BUILD_ENV) and the digest of the grader's own build code (BUILD_CODE, build_code_digest).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess

from grader.common import config
from grader.isolation.device import DeviceInfo
from grader.course.submission import Submission
from grader.build.flags import (EXTRA_CFLAGS, EXTRA_CUDA_CFLAGS, arch_flags, cuda_include_dirs,
                                cutlass_identity, driver_ldflags, headers_digest)


def cuda_mode(device: DeviceInfo) -> str:
    """'extension' (built and linked for this GPU) or 'compile_only' (no GPU: compiled, not run)."""
    return "extension" if device.cuda else "compile_only"


# Environment variables the compilers or torch's extension builder read (the build's child
# inherits the grader's environment): part of every cache key.
BUILD_ENV = ("CC", "CXX", "CUDA_HOME", "CUDA_PATH", "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS",
             "NVCC_CCBIN", "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "LIBRARY_PATH",
             "TORCH_CUDA_ARCH_LIST", "GRADER_CUDA_INCLUDE")


# The grader's code that decides a build's command line and translation unit (load_inline's
# call, the flags, the prelude, the compile check's light extension.h, the entry declaration).
# The grader's files that decide what a build makes (paths below grader/): the build package and
# the numbers in common/config.py. A change to any of them rebuilds every cached submission.
BUILD_CODE = ("build/*.py", "common/config.py")


def build_code_files() -> list[str]:
    return sorted(p.relative_to(config.GRADER_DIR).as_posix()
                  for pattern in BUILD_CODE for p in config.GRADER_DIR.glob(pattern))


def build_inputs(sub: Submission, device: DeviceInfo) -> dict:
    """Everything that decides the files a CUDA build leaves: the build cache's key.

    The submission folder's every file (a build can read any of them, by an absolute #include),
    its module name (compiled in: PyInit_<name>, TORCH_EXTENSION_NAME; two students with the
    same file never share a build), the mode and architecture, the flags, the compilers' own
    version reports, torch's, CUDA's and Python's versions, the environment the compilers read,
    the grader's build code and the compile check's extra headers. Every cached build is
    sandboxed, so it could read nothing else. Resource limits are not in it: they decide whether
    a build finishes, not what a finished one leaves."""
    from grader.course.submission import folder_digest
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
    h = hashlib.sha256()
    for name in build_code_files():
        h.update(name.encode() + b"\0" + (config.GRADER_DIR / name).read_bytes() + b"\0")
    return h.hexdigest()

"""The compiler's side of every CUDA build: the translation unit's prelude, the flags (load_inline's
and the architecture's), the CUDA driver's link (driver_ldflags), and the include folders: CUTLASS
and CuTe (the nvidia-cutlass wheel: cutlass_include) and the compile check's extra CUDA headers
(cuda_include_dirs, headers_digest). What is here is part of every build's cache key (inputs.py).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

from grader.common import config
from grader.isolation.device import find_nvcc


# Every translation unit's first lines, before the submission's source (load_inline's own).
LOAD_INLINE_PRELUDE = ["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>"]


# `check --verbose` sets this for the builds it starts: ptxas then reports each kernel's registers,
# spills, stack and shared memory (-Xptxas=-v), in the build log, which check summarises.
PTXAS_VERBOSE_ENV = "GRADER_PTXAS_VERBOSE"


# load_inline's flags besides the architecture's (build_extension); part of every cache key.
EXTRA_CFLAGS = ("-O3",)
EXTRA_CUDA_CFLAGS = ("-O3", "-lineinfo")


def arch_flags(arch: str) -> list[str]:
    """The flags that decide the device code (one architecture, the GPU's own, or the course
    GPU's without one) and, with PTXAS_VERBOSE_ENV set, ptxas's report on it."""
    verbose = ["-Xptxas=-v"] if os.environ.get(PTXAS_VERBOSE_ENV) == "1" else []
    return [f"-gencode=arch=compute_{arch},code=sm_{arch}", *verbose]


# The CUDA driver, linked into every extension for the one thing a kernel's host code needs from it
# that the runtime does not give: encoding TMA tensor maps (cuTensorMapEncodeTiled, for Hopper's bulk
# tensor copies, as FlashAttention-3 and the solution's kernel 6 use them). Without the link, the
# only way to that call is a driver entry-point lookup, which hands out every driver function and is
# flagged (grader/trusted/audit/). What an object may import from the driver is symbols.DRIVER_ALLOWED; any
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

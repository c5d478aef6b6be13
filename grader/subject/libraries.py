"""What the subject tells the libraries a submission uses, before loading it: TileLang without a
GPU compiles its kernels and launches none (NotRunHere), and SDPA has no cuDNN engine to pick.
Runs inside the subject."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch


# TileLang without a GPU (issue 15). TileLang has no CPU interpreter, so off the GPU its kernels
# are lowered and compiled by nvcc for the course GPU (config.DEFAULT_CUDA_ARCH), exactly as
# tilelang.jit does there, and then not launched: the call ends with a "not_run" reply naming what
# was compiled. The harness takes that claim only where there is no GPU, and nothing is graded.
TILELANG_TARGET_ENV = "TILELANG_DEFAULT_TARGET"
# TileLang's disk cache holds shared libraries it loads into this process, in a folder this
# process can write to: off, so that TileLang loads only what it has just compiled itself.
TILELANG_NO_DISK_CACHE = {"TILELANG_DISABLE_CACHE": "1"}


class NotRunHere(BaseException):
    """A compiled TileLang kernel was about to launch with no GPU to run it. A BaseException,
    so that a submission's `except Exception:` does not turn it into a fallback."""


def tilelang_without_gpu() -> str:
    """Every TileLang kernel launch (JITKernel.__call__, eager and lazy mode alike) raises
    NotRunHere with the kernel's name: by then TileLang has lowered it and nvcc compiled it.
    Returns the nvcc TileLang compiles with, or '' when it has none."""
    from tilelang import env
    from tilelang.jit.kernel import JITKernel

    def launch(kernel, *args, **kwargs):
        try:
            names = re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(",
                               kernel.get_kernel_source())
        except Exception:   # the name is a courtesy; the compile already happened
            names = []
        raise NotRunHere(", ".join(dict.fromkeys(names)) or "the kernel")

    JITKernel.__call__ = launch
    nvcc = os.path.join(env.CUDA_HOME or "/nonexistent", "bin", "nvcc")
    return nvcc if os.access(nvcc, os.X_OK) else ""


def without_cudnn_attention() -> None:
    """A student's subject has no cuDNN engine (grader/isolation/sandbox.py, hide_libraries): SDPA is told
    so, and picks one of PyTorch's own kernels instead of failing inside cuDNN (which it did on
    an H100, "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED", session 19). A submission that calls SDPA
    then launches a library kernel, and is flagged for that, as it always was; one that turns
    cuDNN back on only gets the failure. A default, not a defence: the engines are absent."""
    try:
        torch.backends.cuda.enable_cudnn_sdp(False)
    except AttributeError:   # a torch without cuDNN attention
        pass


def _mentions_tilelang(source: str) -> bool:
    try:
        return any("tilelang" in path.read_text(errors="replace")
                   for path in Path(source).parent.glob("*.py"))
    except OSError:
        return False


def _arch(target: str) -> str:
    try:
        return json.loads(target).get("arch", "the course GPU")
    except (ValueError, AttributeError):
        return "the course GPU"

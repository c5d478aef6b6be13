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
    return _mentions(source, "tilelang")


def _mentions(source: str, word: str) -> bool:
    """Whether a Python file beside `source` (the submission's folder) has `word` in it."""
    try:
        return any(word in path.read_text(errors="replace")
                   for path in Path(source).parent.glob("*.py"))
    except OSError:
        return False


def _arch(target: str) -> str:
    try:
        return json.loads(target).get("arch", "the course GPU")
    except (ValueError, AttributeError):
        return "the course GPU"


def warms_triton(setup: dict) -> bool:
    """Whether a prepared subject warms Triton before its turn: a Python submission whose sources
    name triton, to run on a GPU (Triton's interpreter, off the GPU, has nothing to warm)."""
    target = setup.get("target", {})
    return (setup.get("device") == "cuda" and target.get("kind") == "python"
            and _mentions(target.get("source", ""), "triton"))


def warm_triton() -> list[str]:
    """Triton's first use in a process, done before the submission is loaded (issue 32): its
    import, the hash of its own sources in every kernel's cache key, the GPU driver's helper
    module (compiled with the host's C compiler into TRITON_CACHE_DIR, the submission's own JIT
    folder, on its first use there) and the backend's tool versions. About 2 s of a Triton
    submission's first call (notes/throughput.md, session 24), here on the builds' CPUs while the
    GPU grades the submission before. Only Triton's own code runs, and nothing is launched.
    Best effort: each step that fails is left to the submission's first call, which pays for it
    as it did before; the names of the steps that failed are returned (for the log)."""
    failed = []
    steps = (("import", lambda: __import__("triton.language")),
             ("key", _triton_key),
             ("driver", lambda: __import__("triton.runtime", fromlist=["driver"]).driver.active.utils),
             ("backend", _triton_backend))
    for name, step in steps:
        try:
            step()
        except Exception as e:   # never the submission's problem: its own call tries again
            failed.append(f"{name}: {type(e).__name__}")
    return failed


def _triton_key() -> str:
    try:
        from triton.runtime.cache import triton_key      # Triton 3.5 and later
    except ImportError:
        from triton.compiler.compiler import triton_key  # earlier
    return triton_key()


def _triton_backend() -> str:
    from triton.compiler.compiler import make_backend
    from triton.runtime import driver
    return make_backend(driver.active.get_current_target()).hash()

"""Triton kernels compiled before a submission's GPU turn (issue 32), in the build stage's
sandbox, with no GPU:

    python grader/subject/loop.py --compile-ahead JSON   (grader/build/ahead.py starts it)

A Triton submission's run stage spent most of its ~5 s on the GPU compiling its kernels, one
specialisation per kind of case, while the GPU waited (bench/run_stage_probe.json: 3.8 s of first
calls). Here the submission's custom_kernel is called once per case shape on CPU tensors that
nobody reads, with Triton's driver replaced by one that names the grading GPU's target and launches
nothing: every launch compiles (into TRITON_CACHE_DIR) and returns. Its turn then finds the
kernels compiled (Triton's cache is keyed by the kernel's source, its specialisation and the
target) and launches them.

Nothing here is trusted or decides anything: it runs in the submission's own process, and the
submission can undo any of it. What it can change is its own JIT cache, which its run stage
writes anyway; the grader copies only regular files of Triton's cache from it
(grader/build/ahead.py). Any failure (a kernel that needs the GPU, a Triton whose internals
differ) only means that the run stage compiles, as before.
"""

from __future__ import annotations

import time


class CompileOnlyDriver:
    """Triton's active driver for compiling with no GPU: the grading GPU's target, device 0,
    stream 0. Nothing launches: JITFunction.run is made a warm-up (compile_only)."""

    def __init__(self, capability: int):
        from triton.backends.compiler import GPUTarget
        self.target = GPUTarget("cuda", capability, 32)

    def is_active(self) -> bool:
        return True

    def get_current_target(self):
        return self.target

    def get_current_device(self) -> int:
        return 0

    def set_current_device(self, device) -> None:
        pass

    def get_current_stream(self, device=None) -> int:
        return 0

    def get_active_torch_device(self):
        import torch
        return torch.device("cpu")


def compile_only(capability: int) -> None:
    """Every Triton launch from now on compiles for `capability` (e.g. 90) and launches nothing."""
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction
    driver.set_active(CompileOnlyDriver(capability))
    launch = JITFunction.run
    built: set[int] = set()

    def run(self, *args, grid, warmup, **kwargs):
        kernel = launch(self, *args, grid=grid, warmup=True, **kwargs)
        if kernel is not None and id(kernel) not in built:
            built.add(id(kernel))
            build_launcher(kernel)
        return kernel

    JITFunction.run = run


def build_launcher(kernel) -> None:
    """The native launcher of a compiled kernel built into TRITON_CACHE_DIR, as its first launch
    would: Triton before 3.7 builds one per kernel signature with the host's C compiler (two for
    the kit's Triton example, which session 25's course found its turn building). Nothing where
    this Triton builds none, or cannot here."""
    try:
        from triton.backends.nvidia.driver import CudaLauncher
        CudaLauncher(kernel.src, kernel.metadata)
    except Exception:   # Triton 3.7+ (one launcher for every kernel), or no C compiler: its turn builds it
        pass


def compile_cases(fn, shapes: list[list[int]], capability: int, deadline: float) -> list[dict]:
    """`fn` (the loaded submission: fn(q, k, v)) called once per shape on fp16 CPU tensors whose
    contents are never read (torch.empty: no page is touched unless the submission touches it),
    Triton compiling for `capability`; one record per shape, none begun after `deadline`
    (time.monotonic())."""
    import torch
    compile_only(capability)
    records = []
    for shape in shapes:
        if time.monotonic() >= deadline:
            records.append(dict(shape=shape, ok=False, error="not tried: the time was spent"))
            continue
        began = time.monotonic()
        try:
            q, k, v = (torch.empty(shape, dtype=torch.float16) for _ in range(3))
            fn(q, k, v)
            records.append(dict(shape=shape, ok=True, s=round(time.monotonic() - began, 3)))
        except Exception as e:   # e.g. a kernel that needs the GPU's tensors: compiled at its turn
            records.append(dict(shape=shape, ok=False, s=round(time.monotonic() - began, 3),
                                error=f"{type(e).__name__}: {str(e)[:200]}"))
        finally:
            q = k = v = None
    return records

"""Adversarial, issue 13 (several GPUs) and the build stage: an honest Triton kernel whose module,
when imported, keeps every GPU it can see busy (a real attack stays just under the import limit,
GRADER_IMPORT_S, 120 s; this one hogs 3 s, so that its import at its first case stays well inside
the adversarial runs' 30 s run limit: at 40 s, session 9's GPU run gave this honest file
`timeout`). It prints how many GPUs it sees, which is what the GPU runs check.

Why it works: a Python submission is imported first by the build stage's import check
(build._build_once: subject/loop.py --check-load), and that runs in the plain sandbox
(ctx.sandbox, not Sandbox.for_gpu: every /dev/nvidiaN is bound) with child_env(cuda=True) and no
`gpu`, so CUDA_VISIBLE_DEVICES is the grader's own: every GPU. Builds run while the GPU workers
time other submissions (on one GPU too: builds never take the GPU lock), and the harness's NVML
check counts only CUDA contexts in the timed submission's own process tree. So this file's
import slows down whatever is being timed meanwhile, on every GPU; the rows timed then rank below
this one, and nothing on the page says why. Its own verdict is an honest pass, which is the
problem: the grader should see (or prevent) GPU work outside the subject of the run it times.

Fixed (session 7): the import check runs with no GPU (no /dev/nvidiaN in its sandbox, an empty
CUDA_VISIBLE_DEVICES); this file's hog then finds none, and its import on the GPU happens in the
run stage, on its own GPU worker's GPU, which nothing else uses meanwhile. Its verdict stays pass,
and what it printed is checked (expected.json's gpu_logs; tests/adversarial/verdicts.py and the
GPU test): no GPU in its build log, exactly one (its worker's) in its run log."""
import time

import torch

from honest_flash import custom_kernel as honest

HOG_S = 3.0


def _hog(seconds: float) -> None:
    if not torch.cuda.is_available():   # without a GPU (CI), or once the import check has none
        return
    tiles = [torch.randn(8192, 8192, device=f"cuda:{i}", dtype=torch.float16)
             for i in range(torch.cuda.device_count())]
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for tile in tiles:
            torch.matmul(tile, tile)
        for i in range(len(tiles)):
            torch.cuda.synchronize(i)


print(f"import_gpu_hog: {torch.cuda.device_count() if torch.cuda.is_available() else 0} GPUs visible",
      flush=True)
_hog(HOG_S)


def custom_kernel(data):
    return honest(data)

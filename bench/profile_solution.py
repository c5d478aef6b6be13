"""Run the reference solution on one shape (and SDPA's cuDNN backend after it, with --cudnn), for
a profiler to attach to. Builds the solution as the grader does (grader.build.stage, with the CUDA
driver linked), so a run also shows that its module loads.

    ncu --clock-control none -k regex:attention_kernel6 -c 1 --section SpeedOfLight \
        python bench/profile_solution.py 2 64 4096 128
    ncu --clock-control none --set full -k 'regex:attention_kernel6|cudnn|sdpa' --launch-skip 1 -c 2 \
        python bench/profile_solution.py 2 64 4096 128 --cudnn   # kernel 6's second call, cuDNN's first
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grader.common import config  # noqa: E402
from grader.build.child import build_extension  # noqa: E402
from grader.isolation.device import detect  # noqa: E402
from grader.problem import make_random_inputs  # noqa: E402
from grader.subject.load import load_extension  # noqa: E402


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    shape = tuple(int(x) for x in args[:4]) if len(args) >= 4 else (2, 64, 4096, 128)
    name = "solution_profile"
    path = build_extension(config.SOLUTION_DIR / "submission.cu", name,
                           config.DEFAULT_BUILD / "bench" / name, detect().arch)
    fn = load_extension(str(path), name)
    q, k, v = make_random_inputs(shape, seed=1, device="cuda")
    for _ in range(2):
        fn(q, k, v)
    if "--cudnn" in sys.argv[1:]:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            for _ in range(2):
                torch.nn.functional.scaled_dot_product_attention(q, k, v)
    torch.cuda.synchronize()
    print(f"profiled {shape}: {path.name} loaded and ran")


if __name__ == "__main__":
    main()

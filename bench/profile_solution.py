"""Run the reference solution once on one shape, for a profiler to attach to.

    ncu --clock-control none -k regex:attention_kernel3 -c 1 --section SpeedOfLight \
        python bench/profile_solution.py 2 64 4096 128
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grader import config  # noqa: E402
from grader.build import build_extension  # noqa: E402
from grader.device import detect  # noqa: E402
from grader.inputs import make_random_inputs  # noqa: E402
from grader.subject.loop import load_extension  # noqa: E402


def main() -> None:
    shape = tuple(int(x) for x in sys.argv[1:5]) if len(sys.argv) >= 5 else (2, 64, 4096, 128)
    name = "solution_profile"
    path = build_extension(config.SOLUTION_DIR / "submission.cu", name,
                           config.DEFAULT_BUILD / "bench" / name, detect().arch)
    fn = load_extension(str(path), name)
    q, k, v = make_random_inputs(shape, seed=1, device="cuda")
    for _ in range(2):
        fn(q, k, v)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()

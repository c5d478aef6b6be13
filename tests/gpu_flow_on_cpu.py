"""`python -m grader` with a GPU's flow driven on the CPU, for tests/test_gpus.py: a fake CUDA
device (so runs are begun early, checked and timed as on a GPU) whose processes run on the CPU,
the last CPU for the GPU stages and the others for the builds. The protocol is not calibrated
and no health probe runs. Its own process: nothing of it stays in the test's.

    python tests/gpu_flow_on_cpu.py grade FOLDER --out ... (the grader's arguments)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from grader.cli import grade as grade_mod, main as main_mod

from grader.schedule import workers as scheduling
from grader.stages import context
from grader.stages import health

from grader.isolation import cpus as cpus_mod, procs

from grader.course import verdicts  # noqa: E402
from test_gpus import gpu  # noqa: E402   the tests' fake GPU


def main() -> int:
    mine = sorted(os.sched_getaffinity(0))
    split = cpus_mod.CpuSplit(gpu=(mine[-1],), build=tuple(mine[:-1]) or (mine[-1],))
    grade_mod.detect_gpus = lambda wanted=None, force_cpu=False: [gpu(0)]
    context.GradeContext.device_name = property(lambda self: "cpu")
    context.GradeContext.env = property(lambda self: procs.child_env(cuda=False))
    context.GradeContext.cpus = property(lambda self: split)
    scheduling.calibrate_protocol = lambda ctx, reuse=False: verdicts.ProtocolCost()
    health.probe_gpu = lambda ctx, tries: None   # no GPU to probe; the rest of the check as on one
    return main_mod.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())

"""What the order builds start in does to a cold course's wall time: a small model of the build
pool and one GPU worker, replayed for several orders, mixes and CUDA build times (issue 32,
session 34). Not a measurement: it shows why an order wins, the GPU runs say by how much.

The model, as the grader has it (grader/schedule): `jobs` builds at a time, only `low` of them
while `ahead` or more built submissions wait for the GPU (gate.BuildThrottle); the GPU begins
after the calibration, takes the oldest built submission, each turn a fixed time, a submission
built less than `prepare` s before its turn waiting for its preparation (lookahead). Its default
figures are session 34's cold course on an H200 (bench/course_s34_grade.log): Triton copies
built in about 15 s, the solution's CUDA copies in about 95 s with 13 builds at once, turns of
3.9 s, the GPU's first turn at 31 s. With them the order the grader had (every Python build
first) gives about 610 s against the 617 s measured.

    .venv/bin/python bench/build_order_sim.py            # the table
    .venv/bin/python bench/build_order_sim.py --cuda-build 50 70 95 120 --mix 50:50 10:90
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grader.common import config  # noqa: E402
from grader.course.submission import Kind  # noqa: E402
from grader.schedule.workers import build_order  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Model:
    quick_build: float = 15.0    # a Triton copy's build, import check and compile ahead, s
    cuda_build: float = 95.0     # a CUDA copy's compile with the other builds beside it, s
    quick_turn: float = 4.2      # a Triton copy's GPU turn (run, time; its check is beside), s
    cuda_turn: float = 3.6
    jobs: int = 13
    ahead: int = config.BUILDS_YIELD_AHEAD
    calibrated_at: float = 31.0  # the GPU's first turn
    prepare: float = 12.0        # a run begun early is ready this long after its build
    step: float = 0.25

    @property
    def low(self) -> int:
        """The builds at once while `ahead` wait, as workers.build_throttle has it on a GPU."""
        return max(1, int(self.jobs * config.Limits().build_yield_share))


@dataclasses.dataclass
class Sub:
    id: str
    kind: Kind


def quick_first(subs: list[Sub]) -> list[Sub]:
    """The order before session 34: every Python build first, then the CUDA ones."""
    return sorted(subs, key=lambda s: (Kind.INVALID, Kind.PYTHON, Kind.CUDA).index(s.kind))


ORDERS = {"quick first (before)": quick_first, "in turn (build_order)": build_order}


def course_wall(order: list[Sub], m: Model) -> float:
    """When the last GPU turn ends, the builds started in `order`."""
    todo, building, built = list(order), [], []   # building: (ends, kind); built: (at, kind)
    gpu_free, turns, t = m.calibrated_at, 0, 0.0
    while turns < len(order):
        built += [b for b in building if b[0] <= t]
        building = [b for b in building if b[0] > t]
        built.sort()
        if t >= gpu_free and built and built[0][0] + m.prepare <= max(t, m.calibrated_at):
            _, kind = built.pop(0)
            gpu_free = t + (m.cuda_turn if kind is Kind.CUDA else m.quick_turn)
            turns += 1
        limit = m.low if len(built) >= m.ahead else m.jobs
        while todo and len(building) < limit:
            kind = todo.pop(0).kind
            building.append((t + (m.cuda_build if kind is Kind.CUDA else m.quick_build), kind))
        t += m.step
    return gpu_free


def course(quick: int, cuda: int) -> list[Sub]:
    """A course of `quick` Python and `cuda` CUDA submissions, each kind in id order."""
    return [Sub(f"q{i}", Kind.PYTHON) for i in range(quick)] + \
        [Sub(f"c{i}", Kind.CUDA) for i in range(cuda)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cuda-build", type=float, nargs="+", default=[50.0, 70.0, 95.0, 120.0],
                   help="a CUDA build's seconds (session 30's course: about 50; session 34's: 95)")
    p.add_argument("--mix", nargs="+", default=["50:50", "70:30", "30:70", "10:90", "90:10"],
                   help="Python:CUDA submissions")
    args = p.parse_args()
    print(f"{'Python:CUDA':>11} {'CUDA build s':>12}  " + "  ".join(f"{o:>22}" for o in ORDERS))
    for mix in args.mix:
        quick, cuda = (int(x) for x in mix.split(":"))
        for seconds in args.cuda_build:
            m = Model(cuda_build=seconds)
            walls = [course_wall(order(course(quick, cuda)), m) for order in ORDERS.values()]
            print(f"{mix:>11} {seconds:>12.0f}  " + "  ".join(f"{w:>21.0f}s" for w in walls))


if __name__ == "__main__":
    main()

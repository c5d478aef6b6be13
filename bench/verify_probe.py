"""What the timed loop's check of each call's output costs (issue 13), whole against sampled.

    python bench/verify_probe.py [--calls 20] [--out bench/verify_probe.json]

Between two timed calls the harness checks the output the call left (call_checks.verify_call): every
element written, and config.TIMING_VERIFY_HEADS (batch, head) slices against SDPA. Before issue 13
it compared the whole output with SDPA. This times both on the largest public case, with the
inputs and the output a timed call leaves, and also the rest of a call's own work on this side
(fresh inputs, their copy into the shared buffers, O poisoned, the L2 flushed, O read back).
Writes the figures with the device and the date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from grader.common import config

from grader.trusted import call_checks  # noqa: E402
from grader.problem import largest, load_cases  # noqa: E402
from grader.problem import make_random_inputs  # noqa: E402


def timed_ms(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "verify_probe.json")
    a = p.parse_args()
    case = largest(load_cases(config.PUBLIC_CASES))
    inputs = make_random_inputs(case.shape, seed=1, device="cuda")
    got = torch.nn.functional.scaled_dot_product_attention(*inputs)
    shared = [torch.empty_like(t) for t in (*inputs, got)]
    flush = torch.empty(100 << 20, dtype=torch.uint8, device="cuda")
    everything = case.shape[0] * case.shape[1]
    pick = random.Random(0)

    def verify(heads: int):
        call_checks.verify_call(call_checks.new_verify(), 0, got, inputs, case, pick, heads=heads)

    def call_work():   # what Call.run does on this side besides the call itself
        fresh = make_random_inputs(case.shape, seed=2, device="cuda")
        for dst, src in zip(shared, fresh):
            dst.copy_(src)
        shared[3].fill_(float("nan"))
        flush.zero_()
        shared[3].clone()

    # the sampled check's parts, each with its own wait for the GPU
    sample = call_checks.pick_slices(random.Random(1), case, config.TIMING_VERIFY_HEADS)
    q, k, v = (call_checks.slices(t, sample) for t in inputs)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v).float()
    got_slices = call_checks.slices(got, sample)

    def within():
        return bool(((got_slices.float() - expected).abs_() <= 2e-2 + 2e-2 * expected.abs()).all())

    figures = dict(
        part_finite_whole_ms=timed_ms(lambda: bool(torch.isfinite(got).all()), a.calls),
        part_finite_sum_ms=timed_ms(lambda: bool(torch.isfinite(got.sum(dtype=torch.float32))), a.calls),
        part_slices_ms=timed_ms(lambda: [call_checks.slices(t, sample) for t in (*inputs, got)], a.calls),
        part_sdpa_slices_ms=timed_ms(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v).float(),
                                     a.calls),
        part_within_ms=timed_ms(within, a.calls),
        verify_sampled_ms=timed_ms(lambda: verify(config.TIMING_VERIFY_HEADS), a.calls),
        verify_whole_ms=timed_ms(lambda: verify(everything), a.calls),
        call_work_ms=timed_ms(call_work, a.calls),
        sdpa_ms=timed_ms(lambda: torch.nn.functional.scaled_dot_product_attention(*inputs), a.calls))
    props = torch.cuda.get_device_properties(0)
    result = dict(device=props.name, date=datetime.date.today().isoformat(), torch=torch.__version__,
                  case=case.id, shape=case.shape, heads_sampled=config.TIMING_VERIFY_HEADS,
                  heads=everything, **figures)
    a.out.write_text(json.dumps(result, indent=1))
    print(f"{props.name}, case {case.shape}: " + ", ".join(f"{k} {v:.2f}" for k, v in figures.items()))


if __name__ == "__main__":
    main()

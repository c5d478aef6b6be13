"""In-process timing for benchmarks of our own trusted code (the solution, the baselines): CUDA
events around each call, warm-up, L2 flushed, fresh inputs per call. Grading never uses this: a
submission is timed by grader/trusted/harness.py from another process. The protocol's overhead is the
harness's median against this one's, for the same kernel (bench/protocol_overhead.py)."""

from __future__ import annotations

import os
import statistics
import time

import torch

from grader.common import config
from grader.problem import make_random_inputs
from grader.trusted.timing import relative_standard_error, summarize
from grader.course.verdicts import TimingStats


def time_in_process(fn, shape, *, flops: int, budget_s: float, l2_bytes: int) -> TimingStats:
    flush = torch.empty(max(2 * l2_bytes, 64 << 20), dtype=torch.uint8, device="cuda")
    for _ in range(config.TIMING_WARMUP_CALLS):
        fn(*make_random_inputs(shape, seed=1, device="cuda"))
    times, start = [], time.perf_counter()
    while len(times) < config.TIMING_MAX_REPS:
        q, k, v = make_random_inputs(shape, seed=int.from_bytes(os.urandom(8), "little") >> 1, device="cuda")
        flush.zero_()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        begin.record()
        fn(q, k, v)
        end.record()
        torch.cuda.synchronize()
        times.append(begin.elapsed_time(end))
        if len(times) >= config.TIMING_MIN_REPS and relative_standard_error(times) < config.TIMING_TARGET_RSE:
            break
        if time.perf_counter() - start > budget_s and len(times) >= 2:
            break
    return summarize(times, flops=flops, warmup_calls=config.TIMING_WARMUP_CALLS, budget_s=budget_s,
                     stopped_by="bench", wall_s=time.perf_counter() - start,
                     wall_median_ms=statistics.median(times))

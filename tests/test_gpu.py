"""GPU-only pieces: the reference and the comparison on the device, and the timing loop."""

from __future__ import annotations

import pytest
import torch

from grader.cases import Case
from grader.compare import compare_outputs
from grader.inputs import make_inputs
from grader.reference import attention_reference

from .conftest import cuda_available

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU")]


def test_reference_on_gpu_matches_cpu_and_sdpa():
    case = Case(2, 3, 1000, 64, seed=17)
    q, k, v = make_inputs(case, "cuda")
    ref = attention_reference(q, k, v)
    cpu = attention_reference(q.cpu(), k.cpu(), v.cpu())
    torch.testing.assert_close(ref.cpu(), cpu, rtol=1e-4, atol=1e-5)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert compare_outputs(sdpa, ref).ok


def test_timing_loop_measures_a_known_kernel():
    from grader.timing import time_kernel
    case = Case(1, 16, 2048, 128, seed=1)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    stats, samples = time_kernel(torch.nn.functional.scaled_dot_product_attention, case.shape,
                                 flops=case.flops, budget_s=3, l2_bytes=l2)
    assert stats.n >= 5 and stats.min_ms <= stats.median_ms and stats.tflops > 10
    assert stats.stopped_by in ("rse", "budget", "max_reps")
    # the second clock agrees with the events for an honest kernel on the current stream
    assert stats.median_ms <= stats.wall_median_ms <= stats.median_ms * 1.05 + 0.5
    assert 1 <= len(samples) <= 3 and len({s.call for s in samples}) == len(samples)
    assert all(s.output.shape == case.shape for s in samples)

"""GPU-only pieces: the reference and the comparison on the device, and the timing loop."""

from __future__ import annotations

import pytest
import torch

from grader.problem import Case
from grader.trusted.compare import compare_outputs
from grader.problem import make_inputs
from grader.problem import attention_reference

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


def test_the_harness_times_a_known_kernel_from_another_process(tmp_path):
    import sys
    from grader.trusted import time_stage
    from grader.stages.folders import SUBJECT
    from grader.isolation.procs import child_env
    case = Case(1, 16, 2048, 128, seed=1)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    spec = dict(mode="time", device="cuda", target=dict(kind="builtin", name="sdpa_flash"),
                subject_cmd=[sys.executable, str(SUBJECT)], cwd=str(tmp_path), head_bytes=4096,
                tail_bytes=4096, file_bytes=1 << 32, deadline_s=300, env=child_env(cuda=True),
                case=case.to_dict(), cases=[Case(1, 2, 77, 64, seed=2).to_dict(), case.to_dict()],
                budget_s=3, l2_bytes=l2,
                precision=dict(precision_factor=2.0, precision_floor=1e-3))
    record = time_stage.time_case(spec)
    assert "failed" not in record, record
    stats = record["stats"]
    assert stats["n"] >= 5 and stats["min_ms"] <= stats["median_ms"] and stats["tflops"] > 10
    # the GPU clock trails the host clock by the context switch only: the subject synchronized
    assert stats["wall_median_ms"] <= stats["fence_median_ms"] <= stats["wall_median_ms"] + 1.0
    # the parts of the protocol's cost the subject's account gives: its copy into O, the pipes
    assert 0 < stats["subject_copy_ms"] < stats["median_ms"] and 0 < stats["pipe_ms"] < 1.0, stats
    assert stats["subject_events_ms"] < stats["wall_median_ms"]
    assert record["verify"]["checked"] == stats["n"] + 0 and record["verify"]["wrong"] == 0
    assert 1 <= len(record["spots"]) <= 3 and all(s["finding"]["ok"] for s in record["spots"])
    assert any("flash" in name for name, *_ in stats["launched"])


def test_the_protocol_is_calibrated_on_subjects_that_load_no_submission(tmp_path):
    import sys
    from grader.trusted import calibration
    from grader.stages.folders import SUBJECT
    from grader.isolation.procs import child_env
    case = Case(1, 16, 2048, 128, seed=1)
    spec = dict(mode="calibrate", device="cuda", target=dict(kind="builtin", name="null"),
                subject_cmd=[sys.executable, str(SUBJECT)], cwd=str(tmp_path), head_bytes=4096,
                tail_bytes=4096, file_bytes=1 << 32, deadline_s=300, env=child_env(cuda=True),
                case=case.to_dict(), cases=[Case(1, 2, 77, 64, seed=2).to_dict(), case.to_dict()],
                l2_bytes=torch.cuda.get_device_properties(0).L2_cache_size, reps=8)
    record = calibration.calibrate(spec)
    cost = record["protocol"]
    assert 0 < cost["idle_ms"] < 20 and cost["busy_ms"] > 0 and cost["busy_work_ms"] > 0, record
    assert set(record["breakdown"]) == {"null", *calibration.CALIBRATION_KERNELS}

"""Threat 1's classification of launched kernels and operators, and the two-clock rule."""

from __future__ import annotations

from grader.integrity import (PEAK_MARGIN, classify_launched, kernel_base_name,
                              own_kernel_names, static_evidence, tampering_lines, timing_findings)
from grader.timing import TimingStats

SOURCE = """
template <int D, int WG>
__global__ void __launch_bounds__(WG * (128), 2)
attention_kernel5(const half* q);
__global__ void helper(int a);
// __global__ void in_a_comment(int a);
@triton.autotune(configs=[], key=["S"])
@triton.jit
def _attention_kernel(Q, K):
def softmax_warp_forward(rows):   # a plain function: no kernel
"""

FILL = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<c10::Half>, "
        "std::array<char*, 1ul> >(int, at::native::FillFunctor<c10::Half>, std::array<char*, 1ul>)")
FLASH = ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, "
         "false, cutlass::half_t> >(pytorch_flash::Flash_fwd_params)")


def names(flags):
    return [f.name for f in flags]


def test_own_kernel_names_skip_attributes_and_find_python_kernels():
    assert own_kernel_names(SOURCE) == {"attention_kernel5", "helper", "_attention_kernel"}


def test_kernel_base_name_drops_templates_arguments_and_anonymous_namespaces():
    assert kernel_base_name("void (anonymous namespace)::attention_kernel5<128, 2>(__half const*)") == \
        ("attention_kernel5", "attention_kernel5")
    assert kernel_base_name("void at::native::(anonymous namespace)::cunn_SoftMaxForward<8>(float*)") == \
        ("at::native::cunn_SoftMaxForward", "cunn_SoftMaxForward")


def test_own_kernels_and_data_movement_pass_libraries_and_strangers_are_flagged():
    own = own_kernel_names(SOURCE)
    launched = [("void (anonymous namespace)::attention_kernel5<128, 2>(__half const*)", 1),
                ("_attention_kernel", 3), (FILL, 1), ("Memcpy DtoD (Device -> Device)", 2),
                (FLASH, 1), ("nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NTN", 2),
                ("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n", 1),
                ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, float>(float*)", 1),
                ("_fwd_kernel_from_some_package", 1)]
    flags = classify_launched(launched, own, gpu=True)
    assert names(flags) == [FLASH, "nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NTN",
                            "sm90_xmma_gemm_f16f16_f16f32_f32_tn_n",
                            "void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, float>(float*)",
                            "_fwd_kernel_from_some_package"]
    assert [f.reason for f in flags][-1] == "not in the source"
    # a student's kernel that happens to be called flash_fwd is still theirs
    assert classify_launched([("flash_fwd(float*)", 1)], {"flash_fwd"}, gpu=True) == []


def test_cpu_operators_compute_is_flagged_data_movement_is_not():
    launched = [("aten::empty", 12), ("aten::copy_", 4), ("aten::matmul", 2), ("aten::_softmax", 1),
                ("aten::scaled_dot_product_attention", 1)]
    assert names(classify_launched(launched, set(), gpu=False)) == \
        ["aten::matmul", "aten::_softmax", "aten::scaled_dot_product_attention"]


def test_static_evidence_names_lines_but_skips_comments():
    source = "// at::matmul is not allowed\nauto s = at::matmul(Q, K);\nx = F.softmax(s, -1)\n"
    assert static_evidence(source) == ["line 2: auto s = at::matmul(Q, K);",
                                       "line 3: x = F.softmax(s, -1)"]


OWN = ("void attention_kernel5<128, 2>(__half const*)", 100, 1_700_000.0)
COPY = ("Memcpy DtoD (Device -> Device)", 100, 35_000.0)
CUDNN = ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7", 100, 1_400_000.0)
FLOPS = 4 * 4 * 64 * 8192 ** 2 * 128


def stats(median=18.0, raw_mean=19.2, protocol=1.1, wall=None, fence=None, launched=(OWN, COPY)):
    wall = wall if wall is not None else raw_mean - 0.3
    return TimingStats(n=100, median_ms=median, mean_ms=median, min_ms=median, std_ms=0.1,
                       rse=0.001, tflops=FLOPS / median / 1e9, warmup_calls=2, budget_s=15,
                       stopped_by="rse", wall_s=3.0, wall_median_ms=wall,
                       fence_median_ms=fence if fence is not None else wall + 0.3,
                       raw_mean_ms=raw_mean, protocol_ms=protocol, rtt_ms=0.04,
                       launched=tuple(launched))


def judged(st, record=None, peak=741.0, library_allowed=False):
    return timing_findings(record or {}, st, {"attention_kernel5"}, flops=FLOPS, peak_tflops=peak,
                           library_allowed=library_allowed)


def test_an_honest_kernel_whose_kernels_explain_the_time_stands():
    assert judged(stats()) == []


def test_time_no_observed_kernel_explains_is_flagged_with_the_numbers():
    # the profiler was paused around a library call: its 14 ms are in the clock, not in the trace
    [finding] = judged(stats(raw_mean=33.2, median=32.0))
    assert finding.status == "flagged" and "GPU time unaccounted for" in finding.message
    assert "32.100 ms per timed call" in finding.message and "17.350 ms" in finding.message
    # the library's kernels count only in a calibration run (library calls allowed)
    assert judged(stats(raw_mean=33.2, median=32.0, launched=(OWN, COPY, CUDNN)),
                  library_allowed=True) == []
    assert judged(stats(raw_mean=33.2, median=32.0, launched=(OWN, COPY, CUDNN)))


def test_a_call_that_launched_nothing_is_questioned():
    [finding] = judged(stats(launched=()))
    assert "no GPU kernel was observed" in finding.message


def test_a_median_beyond_the_matmul_peak_is_not_physically_possible():
    fast = FLOPS / (PEAK_MARGIN * 741.0 * 1e12) * 1e3 * 0.9     # ms, 10% past the bound
    st = stats(median=fast, raw_mean=fast + 1.1, launched=((OWN[0], 100, fast * 1e5), COPY))
    findings = judged(st)
    assert any(f.impossible_time and "not physically possible" in f.message for f in findings)
    assert not any(f.impossible_time for f in judged(stats()))


def test_a_median_of_no_time_at_all_is_impossible_and_never_shown():
    # a protocol cost larger than the call (a calibration gone wrong) must not rank at "infinite"
    # TFLOP/s: the median is not a time, whatever the kernels were
    findings = judged(stats(median=-0.05, raw_mean=1.0, protocol=1.1, launched=((OWN[0], 100, 5.0), COPY)))
    assert any(f.impossible_time and "no time at all" in f.message for f in findings)


def test_a_reply_before_the_gpu_work_is_done_shows_in_the_gpu_clock():
    [finding] = judged(stats(wall=17.0, fence=19.1))
    assert "reply came before its GPU work was done" in finding.message


def test_wrong_timed_outputs_helpers_and_precision_are_findings():
    from grader.compare import Finding
    budget = Finding(ok=False, numel=10, mismatches=0, nan_count=0, inf_count=0,
                     max_abs_error=0.009, max_rel_error=0.01, rtol=0.01, atol=0.01,
                     plain_error=0.0004, precision_factor=3.0, precision_floor=0.002)
    record = dict(verify=dict(checked=100, wrong=4, first_wrong_call=6, first_wrong="12 of 99 ..."),
                  spots=[dict(call=3, finding=budget.to_dict())], helpers=[{}, dict(pids=[40, 41])])
    findings = judged(stats(), record)
    statuses = [f.status for f in findings]
    text = "\n".join(f.message for f in findings)
    assert statuses.count("flagged") == 2 and "mismatch" in statuses
    assert "timed call 7 returned a wrong output (4 of 100" in text
    assert "held a CUDA context" in text and "[40, 41]" in text
    assert "precision budget" in text and "fp8" in text


def test_tampering_apis_are_named_by_line_and_comments_are_skipped():
    source = ("import torch\n# torch.profiler is mentioned in a comment\n"
              "torch.profiler._utils.x = 1\nimport gc; objs = gc.get_objects()\n"
              "f = sys._getframe(1).f_back\nfn = torch.compile(attention)\n"
              "at::cuda::CUDAStream s; cudaIpcGetMemHandle(&h, p);\n")
    hits = tampering_lines(source)
    assert [h.split(":")[0] for h in hits] == ["line 3", "line 4", "line 5", "line 6", "line 7"]
    # honest sources have none
    from pathlib import Path
    for path in ["examples/triton_flash/submission.py", "examples/naive_cuda/submission.cu",
                 "examples/tiled_cuda/submission.cu", "solution/submission.cu",
                 "student/submission.cu", "student/triton/submission.py"]:
        assert tampering_lines(Path(path).read_text()) == [], path


def test_a_python_name_never_makes_a_library_kernel_its_own():
    # Red team, session 7 (tests/adversarial/lib_bare_name_py): PyTorch's softmax_warp_forward
    # lives in an anonymous namespace, with no library prefix; a plain `def` of that name, or even
    # a Triton kernel of that name, does not make it the submission's: Python's kernels are
    # reported by bare names, so a name with a C++ signature must come from the submission's C++.
    source = ("\x1esubmission.py\nimport triton\n@triton.jit\ndef softmax_warp_forward(x):\n    pass\n"
              "def dot_kernel(rows):\n    return rows\n")
    own = own_kernel_names(source)
    assert "softmax_warp_forward" in own and "dot_kernel" not in own and not own.cpp
    launched = [("void (anonymous namespace)::softmax_warp_forward<c10::Half, c10::Half, float, 10, "
                 "false, false>(c10::Half*, c10::Half const*, int, int, int, bool const*, int, bool)", 1),
                ("dot_kernel", 1), ("softmax_warp_forward", 3)]
    assert [(f.name[:20], f.reason) for f in classify_launched(launched, own, gpu=True)] == \
        [("void (anonymous name", "not in the source"), ("dot_kernel", "not in the source")]

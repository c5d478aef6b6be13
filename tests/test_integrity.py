"""Threat 1's classification of launched kernels and operators, and the two-clock rule."""

from __future__ import annotations

from grader.trusted.integrity import PEAK_MARGIN, classify_launched, own_kernel_names, static_evidence, tampering_lines, timing_findings
from grader.trusted.audit.kernels import kernel_base_name
from grader.course.submission import FILE_MARK
from grader.course.verdicts import TimingStats

# read_sources' text of a folder with a C++ file and a Python file (FILE_MARK starts each file)
SOURCE = FILE_MARK + "kernels.cu\n" + """
template <int D, int WG>
__global__ void __launch_bounds__(WG * (128), 2)
attention_kernel5(const half* q);
__global__ void helper(int a);
// __global__ void in_a_comment(int a);
""" + FILE_MARK + "submission.py\n" + """
import triton
@triton.autotune(configs=[], key=["S"])
@triton.jit
def _attention_kernel(Q, K):
    pass
def softmax_warp_forward(rows):   # a plain function: no kernel
    return '@triton.jit def in_a_string(X): pass'
"""

FILL = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<c10::Half>, "
        "std::array<char*, 1ul> >(int, at::native::FillFunctor<c10::Half>, std::array<char*, 1ul>)")
FLASH = ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, "
         "false, cutlass::half_t> >(pytorch_flash::Flash_fwd_params)")


def names(flags):
    return [f.name for f in flags]


def test_own_kernel_names_skip_attributes_and_find_python_kernels():
    assert own_kernel_names(SOURCE) == {"attention_kernel5", "helper", "_attention_kernel"}


def test_cpp_kernel_names_come_from_the_object_when_there_is_one():
    """A header nothing compiles names no kernel: with the object's kernels given, the C++
    text is not read (a Python submission passes cpp=(): nothing of it is compiled)."""
    compiled = ["void attention_kernel5<64, 2>(__half const*)"]
    assert own_kernel_names(SOURCE, cpp=compiled) == {"attention_kernel5", "_attention_kernel"}
    assert own_kernel_names(SOURCE, cpp=compiled).cpp == {"attention_kernel5"}
    assert own_kernel_names(SOURCE, cpp=()) == {"_attention_kernel"}


def test_python_kernel_names_come_from_the_syntax_tree_through_the_imports():
    text = ("import triton as tr\nfrom triton import jit\nimport tilelang.language as T\n"
            "@tr.jit\ndef a(X): pass\n@jit(do_not_specialize=[0])\ndef b(X): pass\n"
            "def c(X): pass\nd = tr.jit(c)\n@T.prim_func\ndef e(A): pass\n"
            "# @triton.jit\n# def f(X): pass\n")
    assert own_kernel_names(FILE_MARK + "submission.py\n" + text, cpp=()) == \
        {"a", "b", "c", "e_kernel"}
    # a decorator named jit that is not Triton's makes no kernel
    assert own_kernel_names("def jit(f):\n    return f\n@jit\ndef g(X): pass\n", cpp=()) == set()


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


def busy(subject_ms=None, *, loop_ms=42.0, others_ms=0.0, others=(), device_ms=None,
         source="process", why="") -> dict:
    """A harness's record of NVML's samples over a loop of 100 calls of loop_ms each (the call
    and the grader's work after it): the GPU ms per call busy for the submission's processes,
    for other processes, and for any process at all (timing.GpuBusy)."""
    if subject_ms is None and device_ms is None:
        return dict(source="", why=why or "pynvml (the nvidia-ml-py package) is not installed")
    device_ms = device_ms if device_ms is not None else (subject_ms or 0.0) + others_ms + 1.0
    return dict(source=source, why=why, window_ms=100 * loop_ms, calls=100, sampled_ms=100 * loop_ms,
                periods=25, period_ms=166.0, device_share=device_ms / loop_ms,
                subject_share=(subject_ms or 0.0) / loop_ms, others_share=others_ms / loop_ms,
                others_pids=list(others))


# The kernels seen explain 17.35 ms a call (OWN and COPY over 100 calls).
SEEN_MS = 17.35


def test_time_no_observed_kernel_explains_is_sent_to_review_when_nvml_cannot_tell():
    # 14 ms a call no kernel the profiler saw explains, and nothing says whether the GPU worked
    [finding] = judged(stats(raw_mean=33.2, median=32.0), dict(gpu_busy=busy()))
    assert finding.status == "review" and "cannot tell whether the GPU worked" in finding.message
    assert "32.100 ms per timed call" in finding.message and "17.350 ms" in finding.message
    assert "pynvml (the nvidia-ml-py package) is not installed" in finding.message
    [finding] = judged(stats(raw_mean=33.2, median=32.0))   # a record from before NVML was read
    assert finding.status == "review" and "nothing was recorded" in finding.message
    # the library's kernels count only in a calibration run (library calls allowed)
    assert judged(stats(raw_mean=33.2, median=32.0, launched=(OWN, COPY, CUDNN)),
                  library_allowed=True) == []
    assert judged(stats(raw_mean=33.2, median=32.0, launched=(OWN, COPY, CUDNN)))


def test_gpu_work_the_profiler_did_not_see_is_flagged_with_both_numbers():
    """The profiler was paused around a library call: NVML, read by the harness, saw the
    submission's processes keep the GPU busy for the whole call, 14.75 ms a call more than the
    kernels listed. Its honest twin kept the GPU busy for its kernels only."""
    [finding] = judged(stats(raw_mean=33.2, median=32.0), dict(gpu_busy=busy(32.1)))
    assert finding.status == "flagged" and "GPU time unaccounted for" in finding.message
    assert "busy 32.100 ms per call" in finding.message and "17.350 ms" in finding.message
    assert "At least 13.910 ms per call of GPU work" in finding.message    # 14.75 less NVML's margin
    assert "a paused profiler, a library whose kernels were not listed" in finding.message
    assert judged(stats(), dict(gpu_busy=busy(SEEN_MS))) == []


def test_host_time_with_the_gpu_idle_is_ranked_as_time_with_a_note():
    """Issue 30's fairness finding: a correct kernel whose host code sleeps 20 ms a call was
    flagged "GPU time unaccounted for". NVML saw the submission's processes busy only for its
    kernels and no other process on the GPU: the time ranks, and the page says where it went."""
    slow = stats(raw_mean=38.2, median=37.1)
    [finding] = judged(slow, dict(gpu_busy=busy(SEEN_MS + 0.3, loop_ms=48.0)))
    assert finding.status == "pass" and finding.note == finding.message
    assert finding.note.startswith("host time, ranked: 19.750 ms of the 37.100 ms per timed call")
    # the same time with the GPU busy throughout is hidden work
    assert judged(slow, dict(gpu_busy=busy(37.1, loop_ms=48.0)))[0].status == "flagged"


def test_what_nvml_cannot_tell_apart_is_reviewed_never_accused():
    slow = stats(raw_mean=38.2, median=37.1)
    # 5.5 ms a call of GPU work beyond the kernels: within NVML's margin of the bound (a quarter
    # of the 19.75 ms unexplained: integrity.HIDDEN_SHARE)
    [finding] = judged(slow, dict(gpu_busy=busy(SEEN_MS + 5.5, loop_ms=48.0)))
    assert finding.status == "review" and "between 4.540 and 6.460 ms per call" in finding.message
    assert "up to 4.938 ms it would rank as host time" in finding.message
    # 2.5 ms beyond, well under it: what the submission's own process adds to its kernels (the
    # GPU run of slow_host_py: 2.0 ms a call beyond, of 27.9 unexplained): host time, ranked
    assert judged(slow, dict(gpu_busy=busy(SEEN_MS + 2.5, loop_ms=48.0)))[0].status == "pass"
    # another process, not the submission's, used the GPU meanwhile: it could have done the work
    [finding] = judged(slow, dict(gpu_busy=busy(SEEN_MS, loop_ms=48.0, others_ms=6.0, others=[4242])))
    assert finding.status == "review" and "host pids [4242]" in finding.message


def test_the_whole_gpu_s_samples_bound_what_the_grader_s_own_work_can_hide():
    """Without per-process samples the grader's own work between calls is in NVML's count: the
    most hidden work is the GPU's busy time, the least that less the time between calls."""
    slow, hidden = stats(raw_mean=38.2, median=37.1), stats(raw_mean=33.2, median=32.0)
    whole = dict(source="device", why="NVML: Not Supported")
    # the grader's own work (5 ms a call) may hide hidden work: review
    [finding] = judged(slow, dict(gpu_busy=busy(device_ms=SEEN_MS + 5.0, loop_ms=48.0, **whole)))
    assert finding.status == "review" and "its per-process samples were not used" in finding.message
    # little of it: host time
    [finding] = judged(slow, dict(gpu_busy=busy(device_ms=SEEN_MS + 0.2, loop_ms=48.0, **whole)))
    assert finding.status == "pass"
    # busy through the calls beyond anything the time between them can hold: flagged
    [finding] = judged(hidden, dict(gpu_busy=busy(device_ms=37.1, loop_ms=42.0, **whole)))
    assert finding.status == "flagged" and "whole GPU busy 37.100 ms per call" in finding.message


def test_a_call_that_launched_nothing_is_flagged_with_what_nvml_saw():
    [finding] = judged(stats(launched=()))
    assert finding.status == "flagged" and "no GPU kernel was observed" in finding.message
    assert "not even the copy of the output" in finding.message
    [finding] = judged(stats(launched=()), dict(gpu_busy=busy(18.0)))
    assert "busy 18.000 ms per call: that work ran hidden from the profiler" in finding.message
    [finding] = judged(stats(launched=()), dict(gpu_busy=busy(0.0)))
    assert "leave the GPU idle" in finding.message


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
    from grader.course.verdicts import Finding
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

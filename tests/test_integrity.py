"""Threat 1's classification of launched kernels and operators, and the two-clock rule."""

from __future__ import annotations

from grader.integrity import (classify_launched, clocks_disagree, kernel_base_name,
                              own_kernel_names, static_evidence)

SOURCE = """
template <int D, int WG>
__global__ void __launch_bounds__(WG * (128), 2)
attention_kernel5(const half* q);
__global__ void helper(int a);
def _attention_kernel(Q, K):
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


def test_two_clocks_agree_within_half_a_millisecond_and_five_percent():
    assert clocks_disagree(20.0, 21.4) is None               # 1.4 ms gap, 1.5 ms allowed
    assert "two clocks disagree" in clocks_disagree(20.0, 21.6)
    assert "two clocks disagree" in clocks_disagree(0.06, 17.3)   # work on a private stream

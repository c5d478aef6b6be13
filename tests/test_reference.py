import math

import pytest
import torch

from grader.problem import Case
from grader.problem import make_inputs
from grader.trusted.compare import plain_error_of
from grader.problem import attention_plain_fp16, attention_reference


def _attention_fp64(q, k, v):
    q, k, v = q.double(), k.double(), v.double()
    p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
    return p @ v


@pytest.mark.parametrize("shape", [(1, 1, 1, 64), (2, 3, 77, 64), (1, 2, 130, 128)])
def test_reference_matches_fp64(shape):
    case = Case(*shape, seed=3)
    q, k, v = make_inputs(case, "cpu")
    out = attention_reference(q, k, v)
    assert out.dtype == torch.float32 and out.shape == q.shape
    torch.testing.assert_close(out.double(), _attention_fp64(q, k, v), rtol=1e-5, atol=1e-5)


def test_chunking_does_not_change_the_result():
    q, k, v = make_inputs(Case(2, 2, 100, 64, seed=5), "cpu")
    whole = attention_reference(q, k, v)
    tiny_chunks = attention_reference(q, k, v, chunk_bytes=2 * 100 * 4 * 7)   # 7 rows at a time
    torch.testing.assert_close(whole, tiny_chunks, rtol=0, atol=1e-6)


def test_inputs_are_deterministic_per_seed_and_fp16():
    case = Case(1, 2, 9, 64, seed=1118)
    a, b = make_inputs(case, "cpu"), make_inputs(case, "cpu")
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert a[0].dtype == torch.float16 and a[0].shape == (1, 2, 9, 64)
    assert not torch.equal(a[0], a[1])
    other = make_inputs(Case(1, 2, 9, 64, seed=1119), "cpu")
    assert not torch.equal(a[0], other[0])


# ---------------------------------------------------------------- wide inputs (issue 30, item 7)


def test_default_inputs_are_torch_randn_bit_for_bit():
    """qk_std 1 (every case without the field) draws exactly what it drew before the field
    existed: three torch.randn fp16 tensors from the seed, in the order Q, K, V."""
    case = Case(2, 3, 77, 64, seed=11)
    gen = torch.Generator(device="cpu")
    gen.manual_seed(11)
    plain = [torch.randn(case.shape, generator=gen, dtype=torch.float16) for _ in range(3)]
    assert all(torch.equal(x, y) for x, y in zip(make_inputs(case, "cpu"), plain, strict=True))


def test_qk_std_scales_q_and_k_only():
    narrow = make_inputs(Case(1, 2, 33, 64, seed=4), "cpu")
    wide = make_inputs(Case(1, 2, 33, 64, seed=4, qk_std=6), "cpu")
    for n, w in zip(narrow[:2], wide[:2]):
        assert w.dtype == torch.float16 and torch.equal(w, (n.float() * 6).half())
    assert torch.equal(narrow[2], wide[2])   # V stays N(0, 1): the output keeps V's size
    assert 5 < float(wide[0].float().std()) < 7


@pytest.mark.parametrize("qk_std", [6.0, 8.0])
def test_the_reference_and_the_budget_stay_meaningful_on_wide_inputs(qk_std):
    """On scores past ±100 the fp32 reference (its softmax subtracts the row max) is still within
    2e-4 of an fp64 one (3e-5 to 1.4e-4 on the case files' wide cases: 70 x inside the tolerance
    or more), and the plain fp16 implementation the budget compares with stays finite, up to
    QK_STD_MAX: its error is then a real number, larger than on N(0, 1) inputs because it rounds
    the scores to fp16."""
    q, k, v = make_inputs(Case(1, 2, 130, 128, seed=29, qk_std=qk_std), "cpu")
    scores = q.float() @ k.float().transpose(-1, -2) / math.sqrt(128)
    assert float(scores.abs().max()) > 100
    out = attention_reference(q, k, v)
    torch.testing.assert_close(out.double(), _attention_fp64(q, k, v), rtol=0, atol=2e-4)
    plain = attention_plain_fp16(q, k, v)
    assert bool(torch.isfinite(plain).all())
    narrow = make_inputs(Case(1, 2, 130, 128, seed=29), "cpu")
    narrow_error = plain_error_of(attention_plain_fp16(*narrow), attention_reference(*narrow))
    assert 0 < narrow_error < plain_error_of(plain, out) < 0.5


def test_exp_without_the_running_max_overflows_on_wide_inputs_and_not_on_narrow_ones():
    """What the wide cases are for: softmax as exp(s) / sum exp(s), with no maximum subtracted,
    is NaN on them and right on N(0, 1) inputs; the reference is finite on both."""
    def no_max(q, k, v):
        p = torch.exp(q.float() @ k.float().transpose(-1, -2) / math.sqrt(q.shape[-1]))
        return p @ v.float() / p.sum(-1, keepdim=True)
    for qk_std, finite in ((1.0, True), (6.0, False)):
        q, k, v = make_inputs(Case(1, 2, 130, 64, seed=29, qk_std=qk_std), "cpu")
        out, expected = no_max(q, k, v), attention_reference(q, k, v)
        assert bool(torch.isfinite(out).all()) is finite
        assert bool(torch.isfinite(expected).all())
        if finite:
            torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)

import math

import pytest
import torch

from grader.cases import Case
from grader.inputs import make_inputs
from grader.reference import attention_reference


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

import math

import pytest
import torch

from grader.trusted.compare import compare_outputs
from grader.course.verdicts import Finding


def _pair(shape=(2, 3, 5, 8), seed=0):
    g = torch.Generator().manual_seed(seed)
    expected = torch.randn(shape, generator=g)
    return expected.half(), expected


def test_identical_within_fp16_rounding_passes():
    got, expected = _pair()
    f = compare_outputs(got, expected)
    assert f.ok and f.mismatches == 0 and f.max_abs_error < 2e-3 and not f.first_bad


def test_bad_elements_are_counted_and_located_as_bhsd():
    got, expected = _pair()
    got[1, 2, 4, 7] += 1.0
    got[0, 1, 0, 3] -= 0.5
    f = compare_outputs(got, expected)
    assert not f.ok and f.mismatches == 2
    assert [b.index for b in f.first_bad] == [(0, 1, 0, 3), (1, 2, 4, 7)]
    assert f.first_bad[1].got == pytest.approx(float(got[1, 2, 4, 7]))
    assert f.max_abs_error == pytest.approx(1.0, abs=2e-3)
    assert "2 of 240 elements" in f.summary() and "(1, 2, 4, 7)" in f.summary()


def test_tolerance_boundary_is_atol_plus_rtol_times_expected():
    expected = torch.full((1, 1, 1, 4), 2.0)
    inside = expected + (1e-2 + 1e-2 * 2.0) * 0.9
    outside = expected + (1e-2 + 1e-2 * 2.0) * 1.1
    assert compare_outputs(inside.half(), expected, expected_dtype=None).ok
    assert not compare_outputs(outside, expected, expected_dtype=None).ok


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nan_and_inf_never_pass(bad):
    got, expected = _pair()
    got[0, 0, 0, 0] = bad
    f = compare_outputs(got, expected)
    assert not f.ok and f.mismatches == 1
    assert (f.nan_count, f.inf_count) == ((1, 0) if math.isnan(bad) else (0, 1))
    assert math.isfinite(f.max_abs_error)


def test_all_nan_output_fails():
    got, expected = _pair()
    f = compare_outputs(torch.full_like(got, float("nan")), expected)
    assert not f.ok and f.nan_count == got.numel() and f.mismatches == got.numel()


def test_all_zero_output_is_recognised():
    got, expected = _pair()
    f = compare_outputs(torch.zeros_like(got), expected)
    assert not f.ok and f.all_zero and "all zeros" in f.summary()


def test_wrong_shape_dtype_and_type_are_problems_not_crashes():
    got, expected = _pair()
    assert "shape" in compare_outputs(got[:, :, :4], expected).problem
    assert "dtype" in compare_outputs(got.float(), expected).problem
    assert "torch.Tensor" in compare_outputs([1, 2], expected).problem
    assert not compare_outputs(got.float(), expected).ok


def test_finding_round_trips_through_dict():
    got, expected = _pair()
    got[0, 0, 1, 1] = 9
    f = compare_outputs(got, expected)
    assert Finding.from_dict(f.to_dict()) == f

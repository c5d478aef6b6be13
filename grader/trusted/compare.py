"""Compare an output with the reference: a pure function that returns findings."""

from __future__ import annotations

import dataclasses

import torch

from grader.common import config
from grader.course.verdicts import BadElement, Finding


def compare_outputs(got: torch.Tensor, expected: torch.Tensor, *, rtol: float = config.RTOL,
                    atol: float = config.ATOL, max_report: int = 5,
                    expected_dtype: torch.dtype | None = torch.float16,
                    plain: torch.Tensor | None = None, plain_error: float | None = None,
                    precision_factor: float = config.PRECISION_FACTOR,
                    precision_floor: float = config.PRECISION_FLOOR) -> Finding:
    """Element-wise |got - expected| <= atol + rtol·|expected|; NaN and inf always count as bad.
    With `plain` (the plain fp16 implementation's output on the same inputs), the precision
    budget applies too: max |got - expected| <= precision_factor·max |plain - expected| + floor."""
    base = dict(numel=expected.numel(), rtol=rtol, atol=atol)
    if not isinstance(got, torch.Tensor):
        return _unusable(f"returned {type(got).__name__}, expected a torch.Tensor", **base)
    if tuple(got.shape) != tuple(expected.shape):
        return _unusable(f"output has shape {tuple(got.shape)}, expected "
                         f"{tuple(expected.shape)} (batch, heads, seq, head_dim)", **base)
    if expected_dtype is not None and got.dtype != expected_dtype:
        return _unusable(f"output dtype is {got.dtype}, expected {expected_dtype}", **base)

    got32 = got.to(device=expected.device, dtype=torch.float32)
    finite = torch.isfinite(got32)
    nan_count = int(torch.isnan(got32).sum())
    inf_count = int(torch.isinf(got32).sum())
    diff = (got32 - expected).abs_()
    diff.masked_fill_(~finite, float("inf"))
    bad = diff > atol + rtol * expected.abs()   # inf > anything: NaN and inf are bad
    mismatches = int(bad.sum())
    finite_diff = diff.masked_fill_(~finite, 0.0)
    max_abs = float(finite_diff.max()) if finite_diff.numel() else 0.0
    max_rel = float((finite_diff / expected.abs().clamp_min(atol)).max()) if finite_diff.numel() else 0.0
    first_bad = ()
    if mismatches:
        flat = bad.flatten().nonzero()[:max_report, 0]
        idx = torch.stack(torch.unravel_index(flat, bad.shape), dim=1).tolist()
        first_bad = tuple(BadElement(tuple(i), float(got32[tuple(i)]), float(expected[tuple(i)]))
                          for i in idx)
    all_zero = bool(got32.numel() and not got32.any())
    budget = {}
    if plain_error is None and plain is not None:
        plain_error = plain_error_of(plain, expected)
    if plain_error is not None:
        budget = dict(plain_error=plain_error, precision_factor=precision_factor,
                      precision_floor=precision_floor)
    finding = Finding(ok=mismatches == 0, mismatches=mismatches, nan_count=nan_count,
                      inf_count=inf_count, max_abs_error=max_abs, max_rel_error=max_rel,
                      first_bad=first_bad, all_zero=all_zero, **budget, **base)
    return dataclasses.replace(finding, ok=False) if finding.over_budget else finding


def plain_error_of(plain: torch.Tensor, expected: torch.Tensor) -> float:
    """max |plain - expected|: the plain fp16 implementation's error, the precision budget's unit."""
    if not expected.numel():
        return 0.0
    return float((plain.to(device=expected.device, dtype=torch.float32) - expected)
                 .abs().nan_to_num(posinf=float("inf")).max())


def _unusable(problem: str, **base) -> Finding:
    return Finding(ok=False, mismatches=base["numel"], nan_count=0, inf_count=0,
                   max_abs_error=float("inf"), max_rel_error=float("inf"), problem=problem, **base)

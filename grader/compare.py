"""Compare an output with the reference: a pure function that returns findings."""

from __future__ import annotations

import dataclasses

import torch

from . import config


@dataclasses.dataclass(frozen=True)
class BadElement:
    index: tuple[int, ...]   # (b, h, s, d)
    got: float
    expected: float

    def __str__(self) -> str:
        return f"{self.index}: got {self.got:.6g}, expected {self.expected:.6g}"


@dataclasses.dataclass(frozen=True)
class Finding:
    ok: bool
    numel: int
    mismatches: int          # elements outside the tolerance, NaN and inf included
    nan_count: int
    inf_count: int
    max_abs_error: float     # over finite elements
    max_rel_error: float
    rtol: float
    atol: float
    first_bad: tuple[BadElement, ...] = ()
    all_zero: bool = False   # the output is exactly zero everywhere: nothing was written
    problem: str = ""        # shape or dtype problems that make a comparison meaningless
    # The precision budget (flash-attention's rule): max abs error against the fp32 reference at
    # most `precision_factor` x the plain fp16 implementation's + `precision_floor`.
    plain_error: float | None = None       # the plain fp16 implementation's max abs error
    precision_factor: float | None = None
    precision_floor: float | None = None

    @property
    def precision_ratio(self) -> float | None:
        """The kernel's max abs error over the plain fp16 implementation's (None: not measured)."""
        if self.plain_error is None:
            return None
        return self.max_abs_error / self.plain_error if self.plain_error > 0 else float("inf")

    @property
    def over_budget(self) -> bool:
        if self.plain_error is None or self.precision_factor is None:
            return False
        return self.max_abs_error > self.precision_factor * self.plain_error + (self.precision_floor or 0.0)

    def budget_text(self) -> str:
        if self.plain_error is None:
            return ""
        return (f"precision budget: max abs error {self.max_abs_error:.3g} against the fp32 "
                f"reference; a plain fp16 implementation's is {self.plain_error:.3g} on the same "
                f"inputs (ratio {self.precision_ratio:.2f}); allowed: {self.precision_factor:g} x "
                f"that + {self.precision_floor:g}")

    def summary(self) -> str:
        if self.problem:
            return self.problem
        if self.ok:
            text = (f"ok: max abs error {self.max_abs_error:.3g}, max rel error "
                    f"{self.max_rel_error:.3g} (tolerance atol={self.atol:g}, rtol={self.rtol:g})")
            return text + (f"; error {self.precision_ratio:.2f} x a plain fp16 implementation's"
                           if self.plain_error is not None else "")
        if self.mismatches == 0 and self.over_budget:
            return ("outside the precision budget (every element is within the tolerance, but the "
                    "error is far above what fp16 inputs with fp32 accumulation give: low-precision "
                    "arithmetic, e.g. fp8, is not allowed)\n" + self.budget_text())
        lines = [f"{self.mismatches} of {self.numel} elements outside atol={self.atol:g} + "
                 f"rtol={self.rtol:g}·|expected|; max abs error {self.max_abs_error:.3g}, "
                 f"max rel error {self.max_rel_error:.3g}"]
        if self.nan_count or self.inf_count:
            lines.append(f"NaN: {self.nan_count}, inf: {self.inf_count}")
        if self.all_zero:
            lines.append("the output is all zeros: nothing was written to O")
        if self.over_budget:
            lines.append(self.budget_text())
        lines += [f"  {bad}" for bad in self.first_bad]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["first_bad"] = [dict(index=list(b.index), got=b.got, expected=b.expected)
                          for b in self.first_bad]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Finding":
        known = {f.name for f in dataclasses.fields(cls)}
        d = {k: v for k, v in d.items() if k in known}
        d["first_bad"] = tuple(BadElement(tuple(b["index"]), b["got"], b["expected"])
                               for b in d.get("first_bad", ()))
        return cls(**d)


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

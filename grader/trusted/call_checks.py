"""The checks of each timed call's output, on this process's own copy of its inputs: every
element written and slices picked after the reply compared with SDPA (verify_call), and a few
calls kept by reservoir sampling compared with the fp32 reference under the precision budget
(check_samples)."""

from __future__ import annotations

import dataclasses
import random
import torch

from grader.common import config
from grader.course.verdicts import Finding
from grader.problem import Case, attention_plain_fp16, attention_reference, make_random_inputs
from grader.trusted.compare import compare_outputs


def new_verify() -> dict:
    """verify_call's tally: calls checked, wrong ones, the first wrong one and what was wrong."""
    return dict(checked=0, wrong=0, first_wrong="", first_wrong_call=None)


def verify_call(verify: dict, call: int, got: torch.Tensor, inputs, case: Case,
                pick: random.Random, heads: int = config.TIMING_VERIFY_HEADS) -> None:
    """This call's output, as read right after its reply, checked two ways against this
    process's own copy of the inputs. Every element was written: O was filled with NaN before the
    call, so an element that is not finite was not written (or is wrong). And `heads` of its
    (batch, head) slices, picked here from `pick` (os.urandom's) after the reply, when nothing the
    subject does can change O any more, are compared with SDPA: a subject cannot tell which will
    be looked at, so a stale, replayed, lazy or partly computed output is found in the first
    calls whatever part of it is wrong. The tolerance is twice the cases': precision is the full
    checks' job (check_samples, with the fp32 reference and the precision budget)."""
    sample = pick_slices(pick, case, heads)
    q, k, v = (slices(t, sample) for t in inputs)
    try:
        expected = torch.nn.functional.scaled_dot_product_attention(q, k, v).float()
    except RuntimeError:
        expected = attention_reference(q, k, v)
    rtol, atol = 2 * (case.rtol or config.RTOL), 2 * (case.atol or config.ATOL)
    got_slices = slices(got, sample)
    verify["checked"] += 1
    # The usual case in one wait for the GPU: every element finite, and every sampled one within
    # the tolerance (a NaN is within nothing). compare_outputs' dozen reductions, each read back,
    # took most of the check's ~10 ms a call (H100, session 17). Every element is finite exactly
    # when their sum in fp32 is (all_finite): 0.26 ms on the largest case's output against 1.40
    # for isfinite(got).all() (H100, session 28, bench/verify_probe.py).
    within = (got_slices.float() - expected).abs_() <= atol + rtol * expected.abs()
    if bool(within.all() & all_finite(got)):
        return
    if verify["first_wrong_call"] is not None:   # what was wrong is said once, for the first
        verify["wrong"] += 1
        return
    finding = compare_outputs(got_slices, expected, rtol=rtol, atol=atol)
    unwritten = int(got.numel() - torch.isfinite(got).sum())
    if finding.ok and not unwritten:
        return
    verify["wrong"] += 1
    text = (f"{unwritten} of {got.numel()} elements not written (still NaN, as O was filled "
            f"before the call) or not finite\n" if unwritten else "")
    if not finding.ok:
        text += (f"{len(sample)} of its {case.shape[0] * case.shape[1]} (batch, head) slices, "
                 f"picked after the call returned, compared with SDPA: "
                 + in_slices(finding, sample, case).summary())
    verify["first_wrong_call"], verify["first_wrong"] = call, text.rstrip()


def all_finite(t: torch.Tensor) -> torch.Tensor:
    """Whether every element of `t` is finite, as a 0-dim bool tensor. For float16 (every output
    here), in one reduction: the sum in fp32 is NaN or infinite when any element is, and finite
    when none is, since finite float16 elements (at most 65504, under 2**16) cannot add up past
    fp32's range (2**128) in fewer than 2**112 of them. Any other dtype, element by element."""
    if t.dtype == torch.float16:
        return torch.isfinite(t.sum(dtype=torch.float32))
    return torch.isfinite(t).all()


def pick_slices(pick: random.Random, case: Case, heads: int) -> list[int]:
    """`heads` of the case's batch x heads (batch, head) slices, flat indices in order, drawn
    from `pick` (the harness's os.urandom-seeded generator); all of them when there are no more."""
    n = case.shape[0] * case.shape[1]
    return sorted(pick.sample(range(n), heads)) if n > heads else list(range(n))


def slices(t: torch.Tensor, sample: list[int]) -> torch.Tensor:
    """The (batch, head) slices `sample` of a (batch, heads, seq, head_dim) tensor, as one batch
    of len(sample) heads."""
    return t.flatten(0, 1).index_select(0, torch.tensor(sample, device=t.device)).unsqueeze(0)


def in_slices(finding: Finding, sample: list[int], case: Case) -> Finding:
    """A finding on slices(..., sample), its bad elements' indices put back as (batch, head,
    row, column) of the whole output."""
    h = case.shape[1]
    return dataclasses.replace(finding, first_bad=tuple(
        dataclasses.replace(bad, index=(*divmod(sample[bad.index[1]], h), *bad.index[2:]))
        for bad in finding.first_bad))


def _keep_sample(samples: list, pick: random.Random, call: int, seed: int, o: torch.Tensor,
                 size: int) -> None:
    """Reservoir sampling after call `call` returned: each call so far is kept with equal chance."""
    slot = call if call < size else pick.randrange(call + 1)
    if slot >= size:
        return
    sample = (call, seed, o)
    if slot < len(samples):
        samples[slot] = sample
    else:
        samples.append(sample)


def check_samples(samples: list, case: Case, spec: dict, pick: random.Random,
                  heads: int = config.TIMING_SPOT_HEADS) -> list[dict]:
    """The kept calls against the fp32 reference, with the precision budget, each on `heads` of
    its (batch, head) slices picked from `pick` now, after the last call returned."""
    results = []
    for call, seed, got in samples:
        sample = pick_slices(pick, case, heads)
        q, k, v = (slices(t, sample) for t in make_random_inputs(case.shape, seed=seed, device=got.device,
                                                                  qk_std=case.qk_std))
        finding = compare_outputs(slices(got, sample), attention_reference(q, k, v),
                                  rtol=case.rtol or config.RTOL, atol=case.atol or config.ATOL,
                                  plain=attention_plain_fp16(q, k, v), **spec["precision"])
        results.append(dict(call=call, slices=len(sample),
                            finding=in_slices(finding, sample, case).to_dict()))
        del q, k, v, got
    return results

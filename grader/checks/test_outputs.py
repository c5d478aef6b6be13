"""Correctness of one submission's outputs: one pytest test per case.

Runs in the checker process, never in the process that imported the submission: it
regenerates the inputs from the case's seed, computes the fp32 reference, and compares with the
output file the worker wrote. The grader reads the outcome and the findings (json_metadata)
through pytest-json-report. The spec comes from $GRADER_CHECK_SPEC (see correctness.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from grader import config
from grader.cases import Case
from grader.compare import Finding, compare_outputs
from grader.inputs import make_inputs, make_random_inputs
from grader.reference import attention_reference

SPEC = json.loads(Path(os.environ["GRADER_CHECK_SPEC"]).read_text())
CASES = [Case.from_dict(c) for c in SPEC["cases"]]
DEVICE = SPEC["device"]
# Timed calls picked at random by the timing loop: {'call', 'seed', 'file'}, on SPEC['spot_case'].
SPOTS = SPEC.get("spots", [])


def compare(got, inputs, case: Case, json_metadata: dict) -> Finding:
    """`got` against the reference of `inputs`; the finding and the status go into the report."""
    finding = compare_outputs(got, attention_reference(*inputs), rtol=case.rtol or config.RTOL,
                              atol=case.atol or config.ATOL)
    json_metadata["finding"] = finding.to_dict()
    json_metadata["status"] = "pass" if finding.ok else "mismatch"
    return finding


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_case(case: Case, json_metadata: dict) -> None:
    run = SPEC["runs"][case.id]
    json_metadata["case"] = case.id
    if run["status"] != "pass":
        json_metadata["status"] = run["status"]
        pytest.fail(run["message"], pytrace=False)

    q, k, v = make_inputs(case, DEVICE)
    got = torch.load(Path(SPEC["out_dir"]) / f"{case.id}.pt", map_location=DEVICE)
    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()
    finding = compare(got, (q, k, v), case, json_metadata)
    if DEVICE == "cuda":
        json_metadata["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
    assert finding.ok, finding.summary()


@pytest.mark.parametrize("spot", SPOTS, ids=[f"call{s['call']}" for s in SPOTS])
def test_timed_call(spot: dict, json_metadata: dict) -> None:
    """A timed call's output against the reference of its own fresh inputs (from its seed)."""
    case = Case.from_dict(SPEC["spot_case"])
    json_metadata["call"] = spot["call"]
    got = torch.load(spot["file"], map_location=DEVICE)
    if got is None:
        json_metadata["status"] = "mismatch"
        pytest.fail("the call returned no tensor", pytrace=False)
    finding = compare(got, make_random_inputs(case.shape, seed=spot["seed"], device=DEVICE), case,
                      json_metadata)
    assert finding.ok, finding.summary()

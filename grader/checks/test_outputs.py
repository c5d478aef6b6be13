"""Correctness of one submission's outputs: one pytest test per case.

Runs in the checker process, never in the process that imported the submission: it
regenerates the inputs from the case's seed, computes the fp32 reference and the plain fp16
implementation (the precision budget), and compares with the output the harness read from its
own buffer when the call returned. The grader reads the outcome and the findings
(json_metadata) through pytest-json-report. The spec comes from $GRADER_CHECK_SPEC (see
correctness.py).
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
from grader.inputs import make_inputs
from grader.reference import attention_plain_fp16, attention_reference

SPEC = json.loads(Path(os.environ["GRADER_CHECK_SPEC"]).read_text())
CASES = [Case.from_dict(c) for c in SPEC["cases"]]
DEVICE = SPEC["device"]
PRECISION = SPEC.get("precision", {})


def compare(got, inputs, case: Case, json_metadata: dict) -> Finding:
    """`got` against the fp32 reference of `inputs`, within the tolerance and the precision
    budget; the finding and the status go into the report."""
    finding = compare_outputs(got, attention_reference(*inputs), rtol=case.rtol or config.RTOL,
                              atol=case.atol or config.ATOL, plain=attention_plain_fp16(*inputs),
                              **PRECISION)
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

    if run.get("problem"):   # what it returned cannot be O: wrong type, shape or dtype
        finding = Finding(ok=False, numel=case.numel, mismatches=case.numel, nan_count=0,
                          inf_count=0, max_abs_error=float("inf"), max_rel_error=float("inf"),
                          rtol=case.rtol or config.RTOL, atol=case.atol or config.ATOL,
                          problem=run["problem"])
        json_metadata["finding"] = finding.to_dict()
        json_metadata["status"] = "mismatch"
        pytest.fail(run["problem"], pytrace=False)
    q, k, v = make_inputs(case, DEVICE)
    got = torch.load(Path(SPEC["out_dir"]) / f"{case.id}.pt", map_location=DEVICE,
                     weights_only=True)
    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()
    finding = compare(got, (q, k, v), case, json_metadata)
    if DEVICE == "cuda":
        json_metadata["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
    assert finding.ok, finding.summary()

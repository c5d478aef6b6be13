"""Correctness of one submission's outputs: one pytest test per case.

Runs in the checker process, never in the process that imported the submission: it
regenerates the inputs from the case's seed, computes the fp32 reference and the plain fp16
implementation's error (the precision budget), and compares with the output the harness read
from its own buffer when the call returned. The grader reads the outcome and the findings
(json_metadata) through pytest-json-report. The spec comes from $GRADER_CHECK_SPEC (see
correctness.py), read anew by every pytest session: the warm checker (server.py) runs one
session per submission in one process, and keeps each case's reference between them.
"""

from __future__ import annotations

import collections
import json
import os
from pathlib import Path

import pytest
import torch

from grader.common import config
from grader.course.verdicts import Finding
from grader.problem import Case, attention_plain_fp16, attention_reference, make_inputs
from grader.trusted.compare import compare_outputs, plain_error_of
from grader.trusted.outputs import load_output, output_path

# Each case's fp32 reference and the plain fp16 implementation's error, kept for the next
# submission (least recently used first out past config.CHECK_REFERENCE_BYTES). The inputs, and so
# both, are a function of the case's shape, seed and qk_std and the device alone.
_REFERENCES: "collections.OrderedDict[tuple, tuple[torch.Tensor, float]]" = collections.OrderedDict()


def spec() -> dict:
    return json.loads(Path(os.environ["GRADER_CHECK_SPEC"]).read_text())


def pytest_generate_tests(metafunc) -> None:
    if "case" in metafunc.fixturenames:
        cases = [Case.from_dict(c) for c in spec()["cases"]]
        metafunc.parametrize("case", cases, ids=[c.id for c in cases])


@pytest.fixture(scope="module")
def check_spec() -> dict:
    return spec()


def reference(case: Case, inputs, device: str) -> tuple[torch.Tensor, float]:
    """The fp32 reference of the case's inputs and the plain fp16 implementation's max error."""
    key = (case.shape, case.seed, case.qk_std, device)
    if key in _REFERENCES:
        _REFERENCES.move_to_end(key)
        return _REFERENCES[key]
    expected = attention_reference(*inputs)
    kept = (expected, plain_error_of(attention_plain_fp16(*inputs), expected))
    size = expected.numel() * expected.element_size()
    if size <= config.CHECK_REFERENCE_BYTES:
        _REFERENCES[key] = kept
        while sum(e.numel() * e.element_size() for e, _ in _REFERENCES.values()) > config.CHECK_REFERENCE_BYTES:
            _REFERENCES.popitem(last=False)
    return kept


def compare(got, inputs, case: Case, json_metadata: dict, check_spec: dict) -> Finding:
    """`got` against the fp32 reference of `inputs`, within the tolerance and the precision
    budget; the finding and the status go into the report."""
    expected, plain_error = reference(case, inputs, check_spec["device"])
    finding = compare_outputs(got, expected, rtol=case.rtol or config.RTOL,
                              atol=case.atol or config.ATOL, plain_error=plain_error,
                              **check_spec.get("precision", {}))
    json_metadata["finding"] = finding.to_dict()
    json_metadata["status"] = "pass" if finding.ok else "mismatch"
    return finding


def test_case(case: Case, json_metadata: dict, check_spec: dict) -> None:
    run = check_spec["runs"][case.id]
    device = check_spec["device"]
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
    q, k, v = make_inputs(case, device)
    try:
        got = load_output(output_path(check_spec["out_dir"], case.id), case.shape, device)
    except (OSError, ValueError) as e:   # the harness wrote it: the grader's problem, said so
        why = getattr(e, "strerror", None) or "it is not the size of this case's output"
        json_metadata["status"] = "runtime_error"
        json_metadata["broke"] = f"could not read the run stage's output ({why})"
        pytest.fail(json_metadata["broke"], pytrace=False)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    finding = compare(got, (q, k, v), case, json_metadata, check_spec)
    if device == "cuda":
        json_metadata["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
    assert finding.ok, finding.summary()

"""The problem the course grades, behind one interface: attention forward, softmax(QK^T/sqrt(D))V.

Everything specific to it lives in grader/problem/attention/: the case format's fields (cases),
the inputs made from a case's seed (inputs), the fp32 reference (reference), the baselines timed
beside the submissions (baselines, and baseline_kernels, which a baseline's subject loads like a
submission) and each case's FLOPs (Case.flops). The rest of the grader imports these names from
here and never from the folder itself (an import-linter contract in pyproject.toml), so a second
problem (causal attention, say) is a second folder and a change of the lines below.

The names that need torch are loaded on first use, so that reading cases or results does not load
torch (the pages, exports and the Gradescope autograder run without it).
"""

from __future__ import annotations

import importlib

from grader.problem.attention.cases import (FIELDS, OPTIONAL_FIELDS, QK_STD_MAX, TOLERANCE_FIELDS,
                                            Case, CaseFileError, largest, load_all_cases,
                                            load_cases, parse_case_line, with_cases)

NAME = "attention"
FOLDER = "grader/problem/attention"
# What a baseline's subject loads in place of a submission (grader/subject/loop.py).
BASELINE_KERNELS = "baseline_kernels.py"

_NEEDS_TORCH = {
    "make_inputs": "inputs", "make_random_inputs": "inputs",
    "attention_reference": "reference", "attention_plain_fp16": "reference",
    "BASELINES": "baselines", "Baseline": "baselines",
}

__all__ = ["FIELDS", "OPTIONAL_FIELDS", "QK_STD_MAX", "TOLERANCE_FIELDS", "Case", "CaseFileError",
           "largest", "load_all_cases", "load_cases", "parse_case_line", "with_cases", "NAME",
           "FOLDER", "BASELINE_KERNELS", *_NEEDS_TORCH]


def __getattr__(name: str):
    if name in _NEEDS_TORCH:
        module = importlib.import_module(f"grader.problem.attention.{_NEEDS_TORCH[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'grader.problem' has no attribute {name!r}")

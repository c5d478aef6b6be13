"""Where to look next: one student-facing hint from a result's stages and findings.

The TODO numbers are those of student/submission.cu.
"""

from __future__ import annotations

import re

from .build import BuildResult
from .correctness import CaseResult
from .status import Status

_TODO = re.compile(r"TODO\((\d+)(?:\.(\d+))?\):?\s*(.*)")


def first_open_todo(source: str) -> str | None:
    """The lowest-numbered TODO(n.m) still in the file, with its first line; TODO(0) is
    boilerplate and skipped."""
    todos = []
    for line in source.splitlines():
        m = _TODO.search(line)
        if m and m.group(1) != "0":
            todos.append(((int(m.group(1)), int(m.group(2) or 0)), m.group(0).strip()))
    return min(todos)[1] if todos else None


def hint_for(build: BuildResult | None, cases: list[CaseResult], source: str | None = None) -> str:
    if build is not None and build.status is Status.ENVIRONMENT_ERROR:
        return ("Nothing to change in your code: the grading machine lacked something it should "
                "have. Your submission will be graded again once the machine is fixed.")
    if build is not None and build.status is Status.BUILD_ERROR:
        m = re.search(r"submission\.(cu|py):(\d+)", build.log_tail or "")
        where = f" at line {m.group(2)} of submission.{m.group(1)}" if m else ""
        return f"Fix the first error the compiler reports{where}; later errors often follow from it."
    if build is not None and build.status is Status.TIMEOUT:
        return "The build ran past its time limit: look for huge unrolled loops or templates."
    ran = [c for c in cases if c.status is not Status.NOT_RUN]
    if not ran and source is not None:
        todo = first_open_todo(source)
        if todo:
            return (f"Correctness is not checked without a CUDA device. Your file still has open "
                    f"TODOs; the first is {todo}")
        return ""
    failed = [c for c in ran if c.status is not Status.PASS]
    if not failed:
        return ""
    first = failed[0]
    if first.status is Status.TIMEOUT:
        return (f"Case {first.case} ran past the time limit: check loop bounds (an infinite loop "
                f"or a __syncthreads() that not every thread reaches), then speed.")
    if first.status is Status.RUNTIME_ERROR:
        if "CUDA error" in first.message or "SIGSEGV" in first.message:
            return ("A CUDA error in your kernel, most often an access outside Q, K, V or O: check "
                    "your index arithmetic and the tail guards when seq_len is not a multiple of "
                    "your tile (TODO(2.4)). Run it under compute-sanitizer to find the line.")
        return "The call raised an error: read the message above, then the input checks (TODO(0))."
    finding = first.finding
    if finding is None:
        return ""
    if finding.problem:
        return "Return O with the same shape as Q, dtype float16 (TODO(0))."
    if finding.all_zero:
        return ("O is all zeros: nothing was written to it. Start with TODO(1.1) (the scores) "
                "and TODO(1.4) (writing the output row).")
    if finding.nan_count or finding.inf_count:
        return ("NaN or inf in O: subtract the running max m_i before exponentiating (TODO(1.2), "
                "TODO(2.2)), and give keys past the end weight zero, never garbage (TODO(2.1)).")
    passed = [c for c in ran if c.status is Status.PASS]
    if passed:
        return (f"Some cases pass but {first.case} does not: check the rescaling of acc and l_i by "
                f"exp(m_old - m_new) when a new key raises the max (TODO(1.2), TODO(2.3)), and "
                f"the tails when seq_len is not a multiple of the tile (TODO(2.4)).")
    return ("Every case is wrong: compare one row by hand with the reference: the scale "
            "1/sqrt(D) (TODO(1.1)), then the division by l_i (TODO(1.4)).")

"""Kernel identity (issue 30): which kernels did the work, what the audit could not account for,
and what that does to a verdict. Trusted side: it reads the submission's sources and its build
(the grader's own copies), never imports either.

The rule, in one place: a submission whose every case passed, and whose code holds something the
audit cannot account for (grader/trusted/audit/allowlist.py for Python, reach.native_review for C++), is
`review`, not `pass`: graded, its correctness counted, its time measured and shown to an
instructor, but not ranked until an instructor clears it (grader/course/review.py). Known ways into the
grader's process are a cheat verdict (`flagged`) before anything runs; the review status is not
one, and says so.
"""

from __future__ import annotations

from grader.common.status import Status
from grader.course.results import KernelShare
from grader.course.submission import split_sources
from grader.trusted.audit.allowlist import audit_folder
from grader.trusted.audit.kernels import CPU_ALLOWED_OPS
from grader.trusted.audit.python_kernels import python_kernel_sites
from grader.trusted.integrity import DATA_MOVEMENT, classify_launched, own_kernel_names

# How many of the audit's findings a verdict lists (the result keeps them all).
SHOWN = 6


def python_review(source: str) -> tuple[str, ...]:
    """'file line N: what (why)' for everything a Python submission's files use that the
    allowlist cannot account for (read_sources' text)."""
    return tuple(f.describe() for f in audit_folder(source).review)


def own_kernels(source: str, kind: str, cpp=None):
    """own_kernel_names for a submission of `kind` ('cuda' or 'python'): a Python submission's
    C++ files are compiled by nothing, so none of their names count; a CUDA one's come from its
    object (`cpp`: BuildResult.kernels), never from text (a header nothing compiles names none)."""
    return own_kernel_names(source, cpp=() if kind == "python" else tuple(cpp or ()))


def with_review(status: Status, message: str, review: tuple[str, ...]) -> tuple[Status, str]:
    """A passing verdict with audit findings becomes `review`; every other verdict stands."""
    if status is not Status.PASS or not review:
        return status, message
    lines = [f"{message}; not ranked until an instructor has looked at it, because the grader "
             f"cannot account for what follows (this is not a cheating verdict; README, "
             f"'Whose kernels ran'):"]
    lines += [f"  {line}" for line in review[:SHOWN]]
    if len(review) > SHOWN:
        lines.append(f"  ... and {len(review) - SHOWN} more")
    return Status.REVIEW, "\n".join(lines)


def kernel_shares(launched, source: str, kind: str, cpp=None) -> tuple[KernelShare, ...]:
    """The kernels (or, without a GPU, operators) of `launched` ([name, count, GPU µs] as the
    harness kept them), each with its share of their GPU time and where it is defined: 'file line
    N' of a Python kernel, the compiled object for a C++ one, 'copy or fill', 'library' or 'not in
    the source' (integrity.classify_launched's reasons)."""
    own = own_kernels(source, kind, cpp)
    sites = python_kernel_sites({p: t for p, t in split_sources(source).items()
                                 if p.endswith(".py") or not p}) if kind == "python" else {}
    merged: dict[str, list] = {}
    for x in launched:   # one row per name: a report may list a name more than once
        row = merged.setdefault(str(x[0]), [0, 0.0])
        row[0] += int(x[1])
        row[1] += float(x[2]) if len(x) > 2 else 0.0
    total = sum(us for _, us in merged.values())
    shares = []
    for name, (count, us) in sorted(merged.items(), key=lambda kv: (-kv[1][1], -kv[1][0])):
        flags = classify_launched([(name, count)], own, gpu=us > 0 or not name.startswith("aten::"))
        if DATA_MOVEMENT.search(name) or name in CPU_ALLOWED_OPS:
            where = "copy, fill or a tensor made or viewed"
        elif flags:
            where = flags[0].reason
        else:
            base = name.split("(")[0].split("<")[0].rsplit("::", 1)[-1].split()[-1]
            where = sites.get(base) or ("the compiled submission.cu" if kind == "cuda" else "")
        shares.append(KernelShare(name=name[:300], count=count, gpu_ms=round(us / 1e3, 4),
                                  share=round(us / total, 4) if total > 0 else 0.0, defined_at=where))
    return tuple(shares[:50])

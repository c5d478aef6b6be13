"""Baselines timed by the same code as the submissions, in the same run, on the same GPU.

Their code (grader/problem/attention/baseline_kernels.py) runs in a subject process through the same loop, clock
and checks as a submission; here the trusted side knows their names and labels. The reference
solution in solution/ is a baseline too, built and graded like any CUDA submission.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Baseline:
    name: str
    label: str


def _make() -> dict[str, Baseline]:
    from torch.nn.attention import SDPBackend
    rows = [Baseline("torch_reference", "PyTorch reference"), Baseline("sdpa_flash", "SDPA FLASH")]
    if hasattr(SDPBackend, "CUDNN_ATTENTION"):
        rows.append(Baseline("sdpa_cudnn", "SDPA cuDNN"))
    return {b.name: b for b in rows}


BASELINES = _make()

"""The warm checker: one trusted process that runs the correctness tests (test_outputs.py) for
submission after submission, so that torch's import, the device's initialisation and each case's
fp32 reference are paid once per run rather than once per submission (grader/trusted/correctness.py
starts it and talks to it).

It never imports submission code: it compares outputs the harness saved (loaded as plain
tensors, weights_only). Each request is one JSON line on the request pipe, {"args": [pytest
arguments], "spec": path}; the reply is one JSON line on the reply pipe, {"returncode": N}, once
pytest has written its json report. What pytest prints goes to stdout, which the grader reads
through a capped pipe like any child's.

    python -m grader.trusted.checks.server REQUEST_FD REPLY_FD
"""

from __future__ import annotations

import json
import os
import sys

import pytest


def serve(requests, replies) -> None:
    """Answer requests until the request pipe closes (the grader is done or gone)."""
    for line in requests:
        request = json.loads(line)
        os.environ["GRADER_CHECK_SPEC"] = request["spec"]
        code = pytest.main(request["args"])
        _give_back_memory()
        sys.stdout.flush()
        replies.write(json.dumps({"returncode": int(code)}) + "\n")
        replies.flush()


def _give_back_memory() -> None:
    """Return the GPU memory the check freed (PyTorch's allocator keeps it otherwise): between
    checks the submission's own process runs and is timed on the same GPU, and should find it
    as a fresh checker would have left it. The kept references stay."""
    import torch
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def main(argv: list[str]) -> int:
    request_fd, reply_fd = int(argv[0]), int(argv[1])
    with os.fdopen(request_fd, "r") as requests, os.fdopen(reply_fd, "w") as replies:
        serve(requests, replies)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""THE UNTRUSTED SIDE. Code in this folder runs inside the subject: the one process that imports a
submission. It decides nothing and nothing it says is taken on trust.

- `loop.py`: the process's entry: loads the submission, then runs the calls the harness asks for
  on buffers the harness owns, and reports what happened (JSON lines on a pipe).
- `load.py`: loading a CUDA extension, a Python submission (sources only) or a baseline (the
  PyTorch rows, grader/problem/attention/baseline_kernels.py, run through the same loop as a
  submission, so that every row of the leaderboard is timed the same way).
- `libraries.py`: TileLang without a GPU, SDPA without cuDNN; `tracebacks.py`: errors as the
  harness is told them, cut to the student's own frames.

Every verdict and every time is computed elsewhere, by processes that never import submission
code (grader/trusted/harness.py, grader/schedule/workers.py, the checker); see README "Integrity".
"""

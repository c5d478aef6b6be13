"""THE UNTRUSTED SIDE. Code in this folder runs inside the subject: the one process that imports a
submission. It decides nothing and nothing it says is taken on trust.

- `loop.py`: loads the submission, then runs the calls the harness asks for on buffers the
  harness owns, and reports what happened (JSON lines on a pipe).
- `baselines.py`: the PyTorch baseline rows, run through the same loop as a submission, so that
  every row of the leaderboard is timed the same way.

Every verdict and every time is computed elsewhere, by processes that never import submission
code (grader/harness.py, grader/pipeline.py, the checker); see README "Integrity".
"""

"""THE TRUSTED SIDE: everything that decides a verdict about a submission's kernel.

- harness: starts the subject, hands it inputs, reads its outputs and times its calls (its
  parts: replies, link, subject_start, run_stage, time_stage, timed_calls, call_checks,
  gpu_watch, calibration);
- correctness, checks/: the correctness tests, run by pytest in a trusted process;
- compare: an output against the reference; timing: the per-call statistics;
- integrity, identity, audit/: what a call really ran and whether the grader can account for it.

Never imports grader.subject (an import-linter contract): the subject's code is started as a
process, never imported, and what it says is a claim this side checks.
"""

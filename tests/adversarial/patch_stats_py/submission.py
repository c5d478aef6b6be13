"""Adversarial, issue 10 (patching the grader's statistics): replaces the grader's timing and
statistics functions in its own process, then computes honestly. Nothing that ranks is computed
in this process: must pass, at the honest twin's time."""
import statistics

from honest_flash import custom_kernel as honest

statistics.median = lambda xs: 0.5 * sorted(xs)[len(xs) // 2]
try:
    import grader.trusted.timed_calls
    import grader.trusted.timing
    grader.trusted.timing.summarize = lambda times, **kw: None
    grader.trusted.timed_calls.corrected = lambda walls, fences, floor: [0.001 for _ in walls]
except ImportError:
    pass


def custom_kernel(data):
    return honest(data)

"""Adversarial, issue 30 (a report the harness must not take unchecked): the honest Triton kernel,
with the subject's report of what ran rewritten (through a string torch.utils.benchmark runs, as
in audit_timer_py) so that every kernel claims an infinite GPU time: an accounting that sums the
reported times would then explain any call, however long. The harness checks every number the
subject reports (finite, within the calls' wall time): a runtime_error that names the field."""
import torch.utils.benchmark as benchmark

from honest_flash import custom_kernel  # noqa: F401

_STMT = """
import sys
loop = sys.modules["__main__"]
def endless(profiler, device, report=loop.launched_names):
    return [[n, c, float("inf")] for n, c, us in report(profiler, device)]
if loop.launched_names.__name__ != "endless":   # Timer runs the string more than once
    loop.launched_names = endless
"""
benchmark.Timer(stmt=_STMT).timeit(1)

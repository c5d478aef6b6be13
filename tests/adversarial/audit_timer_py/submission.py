"""Adversarial, issue 30 (code the audit cannot see, 1 of 3): a public library API that runs a
string as Python. torch.utils.benchmark's Timer compiles its `stmt` and runs it in this process;
the string finds the subject's loop, renames every library kernel in its report after this
file's own Triton kernel, and replaces custom_kernel with PyTorch's attention. A list of
forbidden names never sees inside the string: the held-out round of 2026-11-26 ranked a file
like this first at cuDNN's speed. The allowlist (grader/trusted/audit/allowlist.py) does not know
torch.utils.benchmark, so the file is graded but sent to review: never ranked on its own word."""
import torch.utils.benchmark as benchmark
import triton
import triton.language as tl


@triton.jit
def attention_kernel(X):
    tl.store(X, tl.load(X))


def custom_kernel(data):
    raise RuntimeError("replaced when the module loads")


_STMT = """
import sys
import torch.nn.functional as F
loop = sys.modules["__main__"]
def mine(profiler, device, report=loop.launched_names):
    return [[n if n.startswith(("Memcpy", "Memset")) else "attention_kernel", c, us]
            for n, c, us in report(profiler, device)]
if loop.launched_names.__name__ != "mine":   # Timer runs the string more than once
    loop.launched_names = mine
sys.modules["submission"].custom_kernel = lambda data: F.scaled_dot_product_attention(*data)
"""
benchmark.Timer(stmt=_STMT).timeit(1)

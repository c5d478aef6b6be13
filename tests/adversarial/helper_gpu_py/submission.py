"""Adversarial, issue 10 (a helper process): starts a second process that holds a CUDA context
(where work could run unseen by the grader's profiler), with names hidden from a source scan.
On a GPU the harness lists the processes holding a context: must be flagged. Without a GPU the
helper cannot get one and the output is right: pass."""
import sys

from honest_flash import custom_kernel as honest

_spawn = getattr(__import__("sub" + "process"), "Popen")
_helper = _spawn([sys.executable, "-c", "import time, torch\n"
                  "if torch.cuda.is_available(): torch.zeros(1, device='cuda')\n"
                  "time.sleep(900)"])


def custom_kernel(data):
    return honest(data)

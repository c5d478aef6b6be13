"""Adversarial, issue 30 (a submission folder the grader's own process reads): the honest Triton
kernel, unchanged, beside a named pipe called helper.py (a git checkout cannot hold one: the file
FIFOS here lists it, and tests/adversarial/assemble.py makes it). Nothing writes to the pipe, so
any open() of it for reading blocks forever; before issue 30 the grader's own process opened it
(the run's key, folder_digest, and the own-kernel scan, read_sources) and the whole run hung.
Intake refuses the folder before anything is read: build_error, naming helper.py and the fix.
Its honest twin is honest_py: the same kernel, without the pipe."""
from honest_flash import custom_kernel  # noqa: F401

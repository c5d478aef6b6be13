"""Honest twin (issue 10): the Triton kernel the cheats around it share, unchanged. Every cheat's
time is compared with this one's, graded in the same run."""
from honest_flash import custom_kernel  # noqa: F401

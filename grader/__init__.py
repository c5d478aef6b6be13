"""FlashAttention assignment grader: cases -> build -> run -> check -> time -> report."""

__version__ = "0.1.0"

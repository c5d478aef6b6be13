"""Shared vocabulary: the numbers the grader depends on (config), the one status vocabulary
(status) and text made safe where it crosses from a submission (text).

Imports nothing of the grader's: every other package may import it, the subject included.
"""

"""Keeping a submission's processes apart from the grader and each other: the bubblewrap sandbox,
child processes with limits (procs), the CPUs they run on (cpus), process trees by pid (tree),
per-folder quotas, the reaper, and the device probe.

May import common only (and the grader's version). Decides nothing.
"""

"""Where a course's grading runs: on this machine (through schedule) or as a Slurm array (slurm).

May import everything but cli.
"""

"""What a course hands the grader and what a run keeps: drops, submission folders, the roster,
runs and their locks, result files, the grading policy and the review queue.

May import common, problem (the baselines' names) and isolation (a run's token and reaper).
Decides nothing about a kernel; the verdicts it stores come from trusted and build.
"""

"""What a course hands the grader and what a run keeps: drops, submission folders, the roster,
runs and their locks, result files, the grading policy and the review queue.

May import common only, besides its own modules (runs also starts the reaper through isolation).
Decides nothing about a kernel; the verdicts it stores come from trusted and build.
"""

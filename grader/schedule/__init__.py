"""Scheduling: which submission runs where and when. Build workers, one worker per GPU, GPU gates
(lanes), warm harnesses and subjects begun early. It wraps the stages (grader.stages) from
outside; the stages know nothing of it.

May import everything but executors and cli.
"""

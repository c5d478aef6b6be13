"""Attention forward (the course's problem). Imported only through grader.problem."""

"""Build stage: compile a CUDA submission or import a Python one in a sandboxed child process,
with its cache and its student-facing messages.

May import common, problem, course (the submission), isolation and trusted.audit (the headers a
build opened). Never imports schedule, report, executors or cli.
"""

"""The stages one submission goes through after its build, each a function in a module of its
own that returns a typed result, and grade_submission (grade.py), which calls them in order:

    build (grader/build/)  -> run (run.py: Ran)  -> check (check.py: CaseResult per case)
    -> time (time.py: TimedRun)  -> judge (judge.py: the SubmissionResult)

context.py holds what every stage is given (GradeContext); harnesses.py starts the trusted
harness process that runs and times the subject; folders.py is what a submission's stages see
and write; clock.py times the stages; health.py checks the GPU after a crash; early.py begins a
run before its turn; baseline.py grades a PyTorch baseline row.

Scheduling (grader/schedule/) wraps these from outside: it decides which submission runs on
which GPU and when. The stages know it only through turns.py (a GPU's turns, runs begun early),
and never import it. May import course, build, trusted, isolation, problem, report (hints and
feedback text for a result), common.
"""

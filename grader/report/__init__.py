"""What people read: the leaderboard pages, grade exports and LMS formats, feedback and hints, the
privacy rules that keep hidden cases hidden, the terminal's progress display, and what a run
leaves to do with its exit status (summary.py).

Reads results (grader.course) and never imports schedule or isolation (an import-linter
contract in pyproject.toml): a report can be rendered again from the result files alone.
"""

"""What people read: the leaderboard pages, grade exports and LMS formats, feedback and hints, the
privacy rules that keep hidden cases hidden, and the terminal's progress display.

Reads results (grader.course) and never imports schedule or isolation (an import-linter
contract in pyproject.toml): a report can be rendered again from the result files alone.
"""

"""`python -m grader ...`: the command line lives in grader/cli/."""

from grader.cli.main import run

if __name__ == "__main__":
    run()

"""The command line (`python -m grader ...`): parses arguments and calls the packages below.

The top layer: it may import every package; none imports it.
"""

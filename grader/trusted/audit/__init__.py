"""The audit: what a submission's code can reach, read by the grader before any of it runs.
allowed (the lists), allowlist (the Python audit: python_files, paths, scopes, rules, walk;
python_kernels), reach (C++ and what a build opened: symbols, includes, memory_walk, object_file),
findings (what both report), kernels (what a kernel's name says).
"""

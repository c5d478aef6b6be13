"""The wire between the trusted side and the subject: memory shared as file descriptors (buffers)
and the bounded line reader both ends use (lines).

Imports only grader.common. The subject imports it, so nothing here decides anything.
"""

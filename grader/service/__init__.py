"""The course check service (issue 33): students without a GPU submit from the kit, the course's
GPUs grade through the same pipeline, and a live leaderboard shows where they stand.

store.py keeps everything in one SQLite file of the store folder (tokens, submissions and their
queue, results, the audit log) and refuses a second service on the same folder; tokens.py issues,
revokes and reissues the students' tokens from the roster; uploads.py checks an upload before it
is kept; app.py is the HTTP interface and server.py serves it with uvicorn. The grading worker,
`serve` itself, the pages and `make submit` are issue 33's next parts (notes/service.md).

May import course and common; nothing below imports it.
"""

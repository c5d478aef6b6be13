"""The course check service (issue 33): students without a GPU submit from the kit, the course's
GPUs grade through the same pipeline, and a live leaderboard shows where they stand.

store.py keeps everything in one SQLite file of the store folder (tokens, submissions and their
queue, results, the audit log) and refuses a second service on the same folder; tokens.py issues,
revokes and reissues the students' tokens from the roster; uploads.py checks an upload before it
is kept; app.py is the HTTP interface (the API, GET / and GET /leaderboard) and server.py serves
it with uvicorn beside worker.py, which grades the queue's jobs through `make grade`'s pipeline
(given to it by grader/cli/serve.py); pages.py makes the live pages from the stored results.
The student's client is grader/cli/client.py (`make submit`, `make status`), and `make grade`
over a store is grader/course/service_drop.py.

May import course and common; nothing below imports it.
"""

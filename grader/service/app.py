"""The service's HTTP interface (issue 33), a Starlette application served by uvicorn:

    POST /api/submissions        multipart: kind (check | submission), file (.zip or .tar.gz)
                                 Authorization: Bearer TOKEN   ->  201 {id, kind, position}
    GET  /api/submissions/{id}   the submission's state, its place in the queue, its result
    GET  /api/submissions        Bearer TOKEN -> the student's own submissions, newest first, as
                                 they may see them (pages.student_jobs: hidden cases as a count)
    GET  /                       the upload page: the form and the student's own submissions (its
                                 script sends the token in a header; it is never in an address)
    GET  /leaderboard            the live students' page, no token (pages.render_live_board)

Every request is refused before its body is read unless its token is a live student's: a stranger
cannot make the service read or store a byte. Then, in order, each refusal a 4xx with a reason
the student can act on, recorded in the audit log with the address it came from, nothing kept:
401 an unknown or revoked token; 403 the instructor's token (it submits nothing) or the deadline
passed; 400 no kind, or not one of them; 429 over the course's checks per hour or submissions per
day (grading.toml [service]), with Retry-After; 413 larger than upload_mb; and what
uploads.check_upload finds (415, 400, 422). An upload is accepted only once the store has it
whole (Store.accept): the 201 means it will be graded, whatever happens to the service.

The pages are pages.py's: the live board is the students' page `make grade` renders, from the
store's results, by the policy's best or last.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from starlette.applications import Starlette
from starlette.formparsers import MultiPartException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route

from grader.course.policy import Policy
from grader.service.pages import LIVE_TTL_S, LiveBoard, render_home, student_jobs
from grader.service.store import KINDS, Identity, Store
from grader.service.uploads import check_upload
from grader.service.worker import student_view

# What a multipart body may add to its file (field names, boundaries, the kind).
FORM_OVERHEAD = 64 << 10
# A student's own list and the live board change as jobs finish: never kept by a browser or proxy.
NO_STORE = {"Cache-Control": "no-store"}
WINDOWS = {"check": (datetime.timedelta(hours=1), "service_checks_per_hour", "hour"),
           "submission": (datetime.timedelta(days=1), "service_submissions_per_day", "24 hours")}


class Refused(Exception):
    """A request refused: its status, the reason sent back, and headers (Retry-After)."""

    def __init__(self, status: int, reason: str, headers: dict | None = None):
        super().__init__(reason)
        self.status, self.reason, self.headers = status, reason, headers or {}


def create_app(store: Store, policy: Policy, *, scratch: Path | None = None,
               clock=lambda: datetime.datetime.now(datetime.timezone.utc),
               board_ttl_s: float = LIVE_TTL_S) -> Starlette:
    """The application over `store` with the course's `policy`; `clock` (UTC now) for tests;
    `board_ttl_s`: how long one rendering of the live board is served (0: every request)."""
    max_bytes = int(policy.service_upload_mb * (1 << 20))
    board = LiveBoard(store, policy, ttl_s=board_ttl_s, clock=clock)
    home_page = render_home(policy)

    def identify(request: Request) -> Identity:
        return _identify(store, request)

    async def submit(request: Request) -> JSONResponse:
        remote = request.client.host if request.client else ""
        folder, kind = "", ""
        try:
            who = identify(request)
            folder = who.folder
            _may_send(who, request, policy, clock(), max_bytes)
            kind = request.query_params.get("kind", "")
            form = await _form(request, max_bytes)
            kind = str(form.get("kind") or kind)
            if kind not in KINDS:
                raise Refused(400, f"kind {kind!r}: send kind=check (the public cases, not "
                                   f"ranked) or kind=submission (everything, ranked)")
            _within_rate(store, policy, folder, kind, clock())
            upload = form.get("file")
            if upload is None or not hasattr(upload, "read"):
                raise Refused(400, "no file: send the folder's .zip or .tar.gz as the 'file' field")
            data = await upload.read(max_bytes + 1)
            checked = check_upload(data, max_bytes=max_bytes, scratch=scratch)
            if not checked.ok:
                raise Refused(checked.status, checked.reason)
            job = store.accept(folder, kind, data)
        except Refused as no:
            store.audit(folder, "submit", "refused", f"{no.status} {kind}: {no.reason}", remote)
            return JSONResponse({"detail": no.reason}, status_code=no.status, headers=no.headers)
        store.audit(folder, "submit", "accepted", f"{kind} {job.id} ({len(data)} bytes)", remote)
        return JSONResponse({"id": job.id, "kind": kind, "position": store.position(job.id),
                             "status": f"/api/submissions/{job.id}"}, status_code=201)

    async def status(request: Request) -> JSONResponse:
        try:
            who = identify(request)
        except Refused as no:
            return JSONResponse({"detail": no.reason}, status_code=no.status)
        job = store.job(request.path_params["id"])
        if job is None or not (who.instructor or job.folder == who.folder):
            return JSONResponse({"detail": "no such submission of yours"}, status_code=404)
        return JSONResponse({"id": job.id, "kind": job.kind, "state": job.state,
                             "received_at": job.received_at, "position": store.position(job.id),
                             "result": _result_for(job.result, who)})

    def mine(request: Request) -> JSONResponse:
        try:
            who = identify(request)
            if who.instructor:
                raise Refused(403, "the instructor's token has no submissions: ask for one by "
                                   "its id (GET /api/submissions/ID)")
        except Refused as no:
            return JSONResponse({"detail": no.reason}, status_code=no.status)
        return JSONResponse({"submissions": student_jobs(store, who.folder, policy)},
                            headers=NO_STORE)

    def home(request: Request) -> HTMLResponse:
        return HTMLResponse(home_page, headers=NO_STORE)

    def leaderboard(request: Request) -> HTMLResponse:
        return HTMLResponse(board.html(), headers=NO_STORE)

    return Starlette(routes=[Route("/api/submissions", submit, methods=["POST"]),
                             Route("/api/submissions", mine, methods=["GET"]),
                             Route("/api/submissions/{id}", status, methods=["GET"]),
                             Route("/", home, methods=["GET"]),
                             Route("/leaderboard", leaderboard, methods=["GET"])])


def _result_for(result: str | None, who: Identity) -> dict | None:
    """A stored result as `who` may see it: the instructor's in full, a student's as the
    students' view (worker.student_view: no hidden case's shape, the hidden cases a count)."""
    if not result:
        return None
    return json.loads(result) if who.instructor else student_view(result)


def _identify(store: Store, request: Request) -> Identity:
    """The live student (or the instructor) whose token the request carries; Refused (401)."""
    header = request.headers.get("authorization", "")
    token = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else ""
    if not token:
        raise Refused(401, "no token: send 'Authorization: Bearer TOKEN' with the token your "
                           "instructor gave you (make submit TOKEN=...)")
    who, why = store.identify(token)
    if who is None:
        raise Refused(401, "this token was revoked: ask your instructor for a new one"
                      if why == "revoked" else "unknown token: check it against the one your "
                                               "instructor gave you")
    return who


def _may_send(who: Identity, request: Request, policy: Policy, now: datetime.datetime,
              max_bytes: int) -> None:
    """Refused (403) for the instructor's token or after the deadline, (413) for a body its
    length says is too large: before a byte of it is read."""
    if who.instructor:
        raise Refused(403, "the instructor's token submits nothing: use a student's")
    deadline = policy.service_deadline
    if deadline is not None and now > deadline:
        raise Refused(403, f"the deadline passed at {deadline.isoformat()}: nothing more "
                           f"is accepted")
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes + FORM_OVERHEAD:
        raise Refused(413, _too_large(int(length), max_bytes))


async def _form(request: Request, max_bytes: int):
    """The multipart form, one file of at most max_bytes (a chunked body is capped as it comes)."""
    try:
        return await request.form(max_files=1, max_fields=4, max_part_size=max_bytes + 1)
    except ClientDisconnect:
        raise Refused(400, "the upload was cut off") from None
    except MultiPartException as e:   # over max_part_size, or a malformed body
        text = str(e.message)
        if "size" in text.lower():
            raise Refused(413, _too_large(None, max_bytes)) from None
        raise Refused(400, f"not a multipart form with 'kind' and 'file': {text}") from None


def _within_rate(store: Store, policy: Policy, folder: str, kind: str,
                 now: datetime.datetime) -> None:
    window, field, span = WINDOWS[kind]
    allowed = getattr(policy, field)
    since = (now - window).isoformat(timespec="microseconds")
    used, first = store.count_since(folder, kind, since)
    if used >= allowed:
        # when the first of them leaves the window (a limit of 0: a whole window)
        free = datetime.datetime.fromisoformat(first) + window if first else now + window
        wait = max(1, int((free - now).total_seconds()) + 1)
        raise Refused(429, f"{used} {kind}s in the last {span}: this course allows {allowed} "
                           f"(grading.toml [service]); the next one is possible in "
                           f"{wait // 60} min {wait % 60} s",
                      headers={"Retry-After": str(wait)})


def _too_large(size: int | None, max_bytes: int) -> str:
    what = f"the upload is {size / (1 << 20):.1f} MB" if size else "the upload is too large"
    return (f"{what}; this course takes at most {max_bytes / (1 << 20):.1f} MB (grading.toml "
            f"[service] upload_mb). Upload your submission folder's sources only")

"""The service's tokens (issue 33): one per roster student, for the instructor to mail or post
through the LMS, and the instructor's own.

    python -m grader serve tokens --roster roster.csv --store DIR            # issue the missing
    python -m grader serve tokens --store DIR --revoke alice [--reissue]    # one student's

The store keeps only each token's digest (store.py). The tokens themselves are written once, to
`DIR/tokens.csv` (folder, token) and `DIR/instructor.token`, readable by their owner only. Running
it again issues tokens to the roster's new students and keeps everyone else's; a revoked token
stops working at once, and a reissued one replaces it in tokens.csv.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import secrets
from pathlib import Path

from grader.course.roster import Roster
from grader.service.store import Store

TOKENS_CSV = "tokens.csv"
INSTRUCTOR_TOKEN = "instructor.token"


class TokenError(ValueError):
    """A tokens command that cannot be done: the message names the file or student and the fix."""


def new_token() -> str:
    return secrets.token_urlsafe(24)


@dataclasses.dataclass(frozen=True)
class Issued:
    """What one `serve tokens` did: the students given a token now, those who kept theirs, and
    whether the instructor's token was made now."""
    new: tuple[str, ...]
    kept: tuple[str, ...]
    instructor_new: bool


def read_tokens(store: Store) -> dict[str, str]:
    """tokens.csv as {folder: token}; {} when there is none yet."""
    path = store.folder / TOKENS_CSV
    if not path.exists():
        return {}
    rows = list(csv.reader(io.StringIO(path.read_text(encoding="utf-8"))))
    if not rows or rows[0] != ["folder", "token"]:
        raise TokenError(f"{path}: line 1 must be 'folder,token'; it was written by `serve tokens` "
                         f"and edited since: restore it, or revoke and reissue the tokens")
    tokens = {}
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != 2 or not row[0] or not row[1]:
            raise TokenError(f"{path}, line {line}: expected 'folder,token', got {row!r}")
        tokens[row[0]] = row[1]
    return tokens


def _write_private(path: Path, text: str) -> None:
    """Write whole (a rename), readable by the owner only: these are credentials."""
    tmp = path.with_name(path.name + ".part")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _write_tokens(store: Store, tokens: dict[str, str]) -> None:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["folder", "token"])
    for folder in sorted(tokens):
        writer.writerow([folder, tokens[folder]])
    _write_private(store.folder / TOKENS_CSV, out.getvalue())


def issue(store: Store, roster: Roster) -> Issued:
    """A token for each roster student without a live one, and the instructor's if it has none;
    tokens.csv rewritten with every live student token."""
    tokens = read_tokens(store)
    live = store.live_folders()
    new, kept = [], []
    for student in roster.students:
        if student.folder in live and student.folder in tokens:
            kept.append(student.folder)
            continue
        store.revoke(student.folder)   # a live token whose text was lost cannot be mailed
        token = new_token()
        store.add_token(token, student.folder)
        tokens[student.folder] = token
        new.append(student.folder)
    _write_tokens(store, {f: t for f, t in tokens.items() if f in live or f in new})
    instructor = store.folder / INSTRUCTOR_TOKEN
    instructor_new = not instructor.exists()
    if instructor_new:
        token = new_token()
        store.add_token(token, "", role="instructor")
        _write_private(instructor, token + "\n")
    return Issued(tuple(new), tuple(kept), instructor_new)


def revoke(store: Store, folder: str, *, reissue: bool = False) -> str | None:
    """Revoke `folder`'s token (it stops working at once); with `reissue`, give it a new one,
    written to tokens.csv and returned."""
    tokens = read_tokens(store)
    if not store.revoke(folder) and folder not in tokens:
        raise TokenError(f"{folder!r} has no token to revoke: the students with one are in "
                         f"{store.folder / TOKENS_CSV}")
    tokens.pop(folder, None)
    token = None
    if reissue:
        token = new_token()
        store.add_token(token, folder)
        tokens[folder] = token
    _write_tokens(store, tokens)
    return token

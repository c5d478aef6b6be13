"""The course roster (`--roster FILE.csv`): who the submission folders belong to.

One row per student: a `folder` column (the submission folder's name) and any of `sid`,
`email`, `name`, `canvas_id`, plus `section` and `login` for Canvas, and any other column;
every value is kept exactly as given. Joining the roster to the results gives each student's
row, the roster students with no submission (missing) and the submissions that are not on the
roster (extra).
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path
from typing import Generic, TypeVar

KNOWN_COLUMNS = ("sid", "email", "name", "canvas_id", "section", "login")
T = TypeVar("T")


class RosterError(ValueError):
    """The roster file is malformed: the message names the file, the line and the fix."""


@dataclasses.dataclass(frozen=True)
class Student:
    folder: str
    fields: tuple[tuple[str, str], ...]     # (column, value) in the file's column order

    def get(self, column: str) -> str:
        return dict(self.fields).get(column, "")


@dataclasses.dataclass(frozen=True)
class Roster:
    path: Path
    columns: tuple[str, ...]                # every column but `folder`, in the file's order
    students: tuple[Student, ...]


@dataclasses.dataclass(frozen=True)
class Joined(Generic[T]):
    """Roster students with their result (None: no submission), and results not on the roster."""
    columns: tuple[str, ...]
    matched: tuple[tuple[Student, T | None], ...]
    extra: tuple[T, ...]

    @property
    def missing(self) -> tuple[Student, ...]:
        return tuple(s for s, r in self.matched if r is None)


def load_roster(path: Path) -> Roster:
    """Read a roster CSV (UTF-8, with or without a BOM). Raises RosterError naming the line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise RosterError(f"{path}: no such file; pass --roster a CSV with a 'folder' column") from None
    except UnicodeDecodeError as e:
        raise RosterError(f"{path}: not UTF-8 ({e.reason} at byte {e.start}); export it as "
                          f"'CSV UTF-8' and try again") from None
    reader = csv.DictReader(text.splitlines())
    header = [h.strip() for h in reader.fieldnames or []]
    if "folder" not in header:
        raise RosterError(f"{path}:1: no 'folder' column (got {', '.join(header) or 'nothing'}); "
                          f"add one that holds each student's submission folder name")
    if len(set(header)) != len(header):
        raise RosterError(f"{path}:1: a column name appears twice; keep one of each")
    reader.fieldnames = header
    columns = tuple(h for h in header if h != "folder")
    students, seen = [], {}
    for line, row in enumerate(reader, start=2):
        if None in row:
            raise RosterError(f"{path}:{line}: more values than columns; quote values that hold commas")
        folder = (row.get("folder") or "").strip()
        if not folder:
            if any((v or "").strip() for v in row.values()):
                raise RosterError(f"{path}:{line}: empty 'folder'; give the student's submission folder name")
            continue
        if folder in seen:
            raise RosterError(f"{path}:{line}: folder {folder!r} is also on line {seen[folder]}; "
                              f"each folder belongs to one student")
        seen[folder] = line
        students.append(Student(folder, tuple((c, row.get(c) or "") for c in columns)))
    return Roster(path, columns, tuple(students))


def join(roster: Roster, results: list[T], *, key=lambda r: r.result.id) -> Joined[T]:
    """Each roster student with their result; results whose folder is not on the roster."""
    by_folder = {key(r): r for r in results}
    on_roster = {s.folder for s in roster.students}
    return Joined(columns=roster.columns, matched=tuple((s, by_folder.get(s.folder)) for s in roster.students),
                  extra=tuple(r for r in results if key(r) not in on_roster))

"""Course drops: turn what an LMS delivers into one submission folder per student.

`SUBMISSIONS` is a folder, or a .zip/.tar.gz of one (unpacked into the build folder). In it:

- one folder per student (`alice/submission.cu`), or one level deeper (`alice/hw4/submission.cu`),
  or holding one archive (`alice/alice.zip`);
- one archive per student (`alice.zip`, `bob.tar.gz`): unpacked safely into the build folder;
- Canvas's "Download submissions" flat files, `name_uid_subid_submission.cu` (late ones
  `name_LATE_uid_subid_...`): one student per uid, id `name_uid`, the newest file (highest subid)
  graded, older ones listed;
- Gradescope's export: `submission_metadata.yml` and `submission_<id>/` folders, each graded under
  its submitters' emails (else SID, name, folder).
- the check service's store folder (it holds `service.sqlite3`): each student's counted upload
  (grading.toml [service] counts, best or last), unpacked under their roster folder's name
  (service_drop.py).

Every entry that is not graded is a `Skipped(entry, reason)`; a student whose archive breaks a rule
(a path out of the folder, a link, too big, too many files, a zip bomb) gets an INVALID submission
whose problem says which rule, so their row says it, and so does a student whose folder holds a
named pipe, a socket, a device or a link out of it (submission.unsafe_entries). Nothing here raises
for one entry's fault, and nothing here blocks: what intake opens of a drop it opens only as a
regular file, without blocking (submission.open_regular).

The drop's walk is here; one student's folder or archive is student_entries.py's, Canvas's files
and Gradescope's metadata are lms_drops.py's, safe unpacking is archives.py's.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

from grader.common import config
from grader.course.archives import ARCHIVES, ArchiveRejected, _archive_stem, _is_archive, _slug, unpack
from grader.course.lms_drops import (CANVAS, GRADESCOPE_FOLDER, METADATA, MetadataError, _gradescope_id,
                                     canvas_student, gradescope_submitters)
from grader.course.policy import Policy, load_policy
from grader.course.service_drop import StoreUnreadable, is_store, open_service_drop
from grader.course.student_entries import (JUNK, Skipped, _has_submission, _single_top_folder,
                                           student_archive, student_folder)
from grader.course.submission import CUDA_FILE, PYTHON_FILE, Kind, Submission, inspect_folder

UNSUPPORTED = (".rar", ".7z", ".gz", ".bz2", ".xz", ".zst", ".tar.zst", ".cab", ".lz", ".lzma")


class DropError(ValueError):
    """The drop as a whole cannot be graded: no such path, an unreadable or unsafe drop archive,
    or nothing in it to grade. The message says what to do."""


@dataclasses.dataclass(frozen=True)
class Drop:
    root: Path                            # the folder read (an archive drop: where it was unpacked)
    layout: str                           # 'single', 'folders', 'canvas', 'gradescope' (joined by
                                          # '+'), or 'service' (a check service's store)
    submissions: tuple[Submission, ...]   # sorted by id; INVALID ones carry their problem
    skipped: tuple[Skipped, ...]
    summary: str = ""                     # one line for the run to print ('service': which counted)

    @property
    def gradable(self) -> tuple[Submission, ...]:
        return tuple(s for s in self.submissions if s.kind is not Kind.INVALID)


@dataclasses.dataclass(frozen=True)
class _Candidate:
    submission: Submission
    entry: str
    mtime: float


def open_drop(path: Path, *, scratch: Path, require_gradable: bool = True,
              student_limits: config.ArchiveLimits = config.STUDENT_ARCHIVE,
              drop_limits: config.ArchiveLimits = config.DROP_ARCHIVE,
              policy: Policy | None = None) -> Drop:
    """Every student of a drop (a folder, or an archive of one), with the entries not graded and
    why. `scratch`: a folder of the grader's own (in the build folder) for unpacked archives.
    `policy`: the run's (a service store's drop counts by it; default: grading.toml)."""
    path, scratch = Path(path), Path(scratch)
    if not path.exists():
        raise DropError(f"{path}: no such folder of submissions. Pass a folder that contains one "
                        f"folder per student, one submission folder, or a .zip/.tar.gz of one.")
    if is_store(path):
        return _read_store(path, scratch, student_limits, policy or load_policy(), require_gradable)
    if path.is_file():
        if not _is_archive(path.name):
            raise DropError(f"{path}: not a folder nor an archive of one "
                            f"({', '.join(ARCHIVES)}).")
        dest = scratch / "course" / _slug(path.name)
        try:
            unpack(path, dest, drop_limits)
        except ArchiveRejected as e:
            raise DropError(f"{path}: {e}") from None
        root = _single_top_folder(dest)
        single_id = _archive_stem(path.name) if root == dest else root.name
    else:
        root, single_id = path, path.name
    if _has_submission(root):   # one student's folder (`make check`, a student's own archive)
        return Drop(root, "single", (inspect_folder(root, id=single_id),), ())
    drop = _read_drop(root, scratch, student_limits)
    if require_gradable and not drop.gradable:
        lines = [f"{path}: no gradable submission (a folder, archive or Canvas file holding "
                 f"{CUDA_FILE} or {PYTHON_FILE})."]
        lines += [f"  {s.id}: {s.problem}" for s in drop.submissions[:10]]
        lines += [f"  {s.entry}: {s.reason}" for s in drop.skipped[:20]]
        if not drop.submissions and not drop.skipped:
            lines.append("  the folder is empty")
        raise DropError("\n".join(lines))
    return drop


def _read_store(path: Path, scratch: Path, limits: config.ArchiveLimits, policy: Policy,
                require_gradable: bool) -> Drop:
    """A check service's store: each student's counted upload (service_drop.py)."""
    try:
        found = open_service_drop(path, scratch=scratch, policy=policy, limits=limits)
    except StoreUnreadable as e:
        raise DropError(str(e)) from None
    drop = Drop(path, "service", found.submissions, found.skipped, found.summary)
    if require_gradable and not drop.gradable:
        lines = [f"{path}: the service's store holds no gradable submission (checks never count)."]
        lines += [f"  {s.id}: {s.problem}" for s in drop.submissions[:10]]
        lines += [f"  {s.entry}: {s.reason}" for s in drop.skipped[:20]]
        raise DropError("\n".join(lines))
    return drop


def _read_drop(root: Path, scratch: Path, limits: config.ArchiveLimits) -> Drop:
    candidates: list[_Candidate] = []
    skipped: list[Skipped] = []
    layouts: list[str] = []
    try:
        entries = sorted(root.iterdir(), key=lambda p: p.name)
    except OSError as e:
        raise DropError(f"{root}: cannot list the folder ({e.strerror}).") from None
    gradescope = _read_gradescope_metadata(root, skipped, layouts)
    canvas: dict[str, list[tuple[int, str, Path]]] = {}   # uid -> [(subid, file, path)]
    canvas_names: dict[str, str] = {}
    for entry in entries:
        name = entry.name
        shown = name + ("/" if entry.is_dir() else "")
        try:
            if name == METADATA and gradescope is not None:
                continue
            if name in JUNK:
                skipped.append(Skipped(shown, "macOS archive metadata, not a submission"))
                continue
            if name.startswith("."):
                skipped.append(Skipped(shown, "hidden (its name starts with '.'): not graded"))
                continue
            if name.startswith("_"):
                skipped.append(Skipped(shown, "set aside (its name starts with '_'): not graded; "
                                              "rename it to grade it"))
                continue
            if entry.is_dir():
                _read_folder(entry, shown, gradescope, scratch, limits, candidates, skipped, layouts)
                continue
            if not entry.is_file():
                skipped.append(Skipped(shown, "not a regular file or folder"))
                continue
            m = CANVAS.match(name)
            if m:
                canvas.setdefault(m["uid"], []).append((int(m["subid"]), m["file"], entry))
                canvas_names.setdefault(m["uid"], m["name"].lower())
                continue
            if _is_archive(name):
                sid = _archive_stem(name)
                candidates.append(_Candidate(student_archive(entry, sid, scratch, limits), name,
                                             _mtime(entry)))
                if "folders" not in layouts:
                    layouts.append("folders")
                continue
            if name.lower().endswith(UNSUPPORTED):
                skipped.append(Skipped(name, "an archive of a kind the grader does not unpack; "
                                             "re-pack it as .zip or .tar.gz"))
                continue
            skipped.append(Skipped(name, "a stray file: not a student folder, an archive or a "
                                         "Canvas submission file (name_uid_subid_file)"))
        except OSError as e:   # one unreadable entry is listed; the others are still graded
            skipped.append(Skipped(shown, f"cannot be read ({e.strerror or e})"))
    if gradescope:
        for folder, submitters in sorted(gradescope.items()):
            if not (root / folder).is_dir():
                skipped.append(Skipped(folder + "/", f"in {METADATA} ({_gradescope_id(submitters, folder)}) "
                                                     f"but not in the export"))
    if canvas:
        layouts.append("canvas")
        _read_canvas(canvas, canvas_names, scratch, limits, candidates, skipped)
    submissions, clashes = _unique(candidates)
    return Drop(root, "+".join(layouts) or "folders", submissions, tuple(skipped + clashes))


def _read_gradescope_metadata(root: Path, skipped: list[Skipped],
                              layouts: list[str]) -> dict[str, list[dict]] | None:
    """The submitters of a Gradescope export's folders (lms_drops.gradescope_submitters), {} if
    its metadata cannot be read (listed in `skipped`), None if the drop is not such an export."""
    gradescope: dict[str, list[dict]] | None = None
    if (root / METADATA).is_file():
        try:
            gradescope = gradescope_submitters(root / METADATA)
        except (MetadataError, OSError, RecursionError) as e:   # never the whole drop's end
            skipped.append(Skipped(METADATA, f"cannot be read ({e}); its folders are graded "
                                             f"under their folder names"))
            gradescope = {}
        layouts.append("gradescope")
    return gradescope


def _read_folder(entry: Path, shown: str, gradescope: dict[str, list[dict]] | None, scratch: Path,
                 limits: config.ArchiveLimits, candidates: list[_Candidate], skipped: list[Skipped],
                 layouts: list[str]) -> None:
    """One folder of the drop: a student's, or a Gradescope export's submission_<id>/ (graded
    under its submitters' id)."""
    name = entry.name
    sid = name
    if gradescope is not None and GRADESCOPE_FOLDER.match(name):
        sid = _gradescope_id(gradescope.get(name), name)
        if name not in gradescope and gradescope:
            skipped.append(Skipped(shown, f"not in {METADATA}: graded as '{sid}'"))
    found = student_folder(entry, sid, scratch, limits)
    if isinstance(found, Skipped):
        skipped.append(Skipped(shown, found.reason))
    else:
        candidates.append(_Candidate(found, shown, _mtime(entry)))
        if "folders" not in layouts and not GRADESCOPE_FOLDER.match(name):
            layouts.append("folders")


def _read_canvas(canvas: dict[str, list[tuple[int, str, Path]]], canvas_names: dict[str, str],
                 scratch: Path, limits: config.ArchiveLimits, candidates: list[_Candidate],
                 skipped: list[Skipped]) -> None:
    """Canvas's flat files, one student per uid (lms_drops.canvas_student)."""
    for uid, files in sorted(canvas.items()):
        newest = max(files, key=lambda f: f[0])[2]
        try:
            found, older = canvas_student(f"{canvas_names[uid]}_{uid}", files, scratch, limits)
        except OSError as e:
            skipped += [Skipped(p.name, f"cannot be read ({e.strerror or e})") for _, _, p in files]
            continue
        skipped += older
        candidates.append(_Candidate(found, newest.name, _mtime(newest)))


def _unique(candidates: list[_Candidate]) -> tuple[tuple[Submission, ...], list[Skipped]]:
    """One submission per id: two entries that name the same student (a folder and an archive
    of one name) are never both graded under one id; the newest is, the other is listed."""
    by_id: dict[str, list[_Candidate]] = {}
    for c in candidates:
        c = dataclasses.replace(c, submission=dataclasses.replace(c.submission, id=_capped(c.submission.id)))
        by_id.setdefault(c.submission.id, []).append(c)
    kept, skipped = [], []
    for sid, group in sorted(by_id.items()):
        group.sort(key=lambda c: (-c.mtime, c.entry))
        kept.append(group[0].submission)
        skipped += [Skipped(c.entry, f"the same student id '{sid}' as {group[0].entry}, which is "
                                     f"newer and is graded") for c in group[1:]]
    return tuple(kept), skipped


# ---------------------------------------------------------------- names


ID_BYTES = 120   # an id names files (`.<id>.json.<random>.tmp`, `logs/<id>.build.log`): < 255


def _capped(sid: str) -> str:
    """The id, or for a very long one (a group of long emails) its start and a hash of it all."""
    if len(sid.encode("utf-8", "surrogatepass")) <= ID_BYTES:
        return sid
    digest = hashlib.sha256(sid.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    head = sid.encode("utf-8", "surrogatepass")[:ID_BYTES - 14].decode("utf-8", "ignore")
    return f"{head}~{digest}"


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def discover(root: Path, *, scratch: Path | None = None) -> list[Submission]:
    """Every student of a drop, sorted by id; `root` itself if it is a submission folder. The
    layouts a course gets (folders, nested folders, archives, Canvas and Gradescope exports) and
    the entries left out, with why, are open_drop's, which returns both. Raises DropError for a
    missing path or a drop with nothing to grade."""
    scratch = scratch or config.DEFAULT_BUILD / config.DROP_SCRATCH
    return list(open_drop(Path(root), scratch=scratch).submissions)

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

Every entry that is not graded is a `Skipped(entry, reason)`; a student whose archive breaks a rule
(a path out of the folder, a link, too big, too many files, a zip bomb) gets an INVALID submission
whose problem says which rule, so their row says it, and so does a student whose folder holds a
named pipe, a socket, a device or a link out of it (submission.unsafe_entries). Nothing here raises
for one entry's fault, and nothing here blocks: what intake opens of a drop it opens only as a
regular file, without blocking (submission.open_regular).
"""

from __future__ import annotations

import bz2
import contextlib
import dataclasses
import errno
import gzip
import hashlib
import lzma
import os
import re
import shutil
import stat
import tarfile
import unicodedata
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from . import config
from .submission import (CUDA_FILE, PYTHON_FILE, Kind, NotRegular, Submission, inspect_folder,
                         kind_of, open_regular, read_regular, refusal, unsafe_entries)

ARCHIVES = (".zip", ".tar.gz", ".tgz", ".tar", ".tar.bz2", ".tar.xz")
UNSUPPORTED = (".rar", ".7z", ".gz", ".bz2", ".xz", ".zst", ".tar.zst", ".cab", ".lz", ".lzma")
METADATA = "submission_metadata.yml"       # Gradescope's export
METADATA_BYTES = 64 << 20                   # about 100 kB per thousand students: ample
JUNK = ("__MACOSX",)                        # macOS's resource forks in a zip
# Canvas: {name}[_LATE]_{user id}_{attachment id}_{original file name}; a re-upload of one name
# becomes "submission-1.cu".
CANVAS = re.compile(r"^(?P<name>[^_/]+?)_(?:(?P<late>late)_)?(?P<uid>\d+)_(?P<subid>\d+)_(?P<file>.+)$",
                    re.IGNORECASE)
GRADESCOPE_FOLDER = re.compile(r"^submission_\d+$")


class DropError(ValueError):
    """The drop as a whole cannot be graded: no such path, an unreadable or unsafe drop archive,
    or nothing in it to grade. The message says what to do."""


# Errors of the machine while unpacking: the entry is listed as not graded, never scored.
MACHINE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EMFILE, errno.ENFILE, errno.EIO,
                            errno.EROFS, errno.ENOMEM})


class ArchiveRejected(ValueError):
    """One archive broke a rule; the message names it and the limit."""


@dataclasses.dataclass(frozen=True)
class Skipped:
    entry: str      # the name as it is in the drop ("_old/", "alice_1_2_submission-1.cu")
    reason: str

    def to_dict(self) -> dict:
        return dict(entry=self.entry, reason=self.reason)


@dataclasses.dataclass(frozen=True)
class Drop:
    root: Path                            # the folder read (an archive drop: where it was unpacked)
    layout: str                           # 'single', 'folders', 'canvas', 'gradescope', joined by '+'
    submissions: tuple[Submission, ...]   # sorted by id; INVALID ones carry their problem
    skipped: tuple[Skipped, ...]

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
              drop_limits: config.ArchiveLimits = config.DROP_ARCHIVE) -> Drop:
    """Every student of a drop (a folder, or an archive of one), with the entries not graded and
    why. `scratch`: a folder of the grader's own (in the build folder) for unpacked archives."""
    path, scratch = Path(path), Path(scratch)
    if not path.exists():
        raise DropError(f"{path}: no such folder of submissions. Pass a folder that contains one "
                        f"folder per student, one submission folder, or a .zip/.tar.gz of one.")
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


def _read_drop(root: Path, scratch: Path, limits: config.ArchiveLimits) -> Drop:
    candidates: list[_Candidate] = []
    skipped: list[Skipped] = []
    layouts: list[str] = []
    try:
        entries = sorted(root.iterdir(), key=lambda p: p.name)
    except OSError as e:
        raise DropError(f"{root}: cannot list the folder ({e.strerror}).") from None
    gradescope: dict[str, list[dict]] | None = None
    if (root / METADATA).is_file():
        try:
            gradescope = gradescope_submitters(root / METADATA)
        except (MetadataError, OSError, RecursionError) as e:   # never the whole drop's end
            skipped.append(Skipped(METADATA, f"cannot be read ({e}); its folders are graded "
                                             f"under their folder names"))
            gradescope = {}
        layouts.append("gradescope")
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
        for uid, files in sorted(canvas.items()):
            newest = max(files, key=lambda f: f[0])[2]
            try:
                found, older = canvas_student(f"{canvas_names[uid]}_{uid}", files, scratch, limits)
            except OSError as e:
                skipped += [Skipped(p.name, f"cannot be read ({e.strerror or e})") for _, _, p in files]
                continue
            skipped += older
            candidates.append(_Candidate(found, newest.name, _mtime(newest)))
    submissions, clashes = _unique(candidates)
    return Drop(root, "+".join(layouts) or "folders", submissions, tuple(skipped + clashes))


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


# ---------------------------------------------------------------- one student


def student_folder(folder: Path, sid: str, scratch: Path, limits: config.ArchiveLimits, *,
                   archive_inside: bool = True) -> Submission | Skipped:
    """A student's folder: the submission at its top, one level down (`hw4/submission.cu`), or
    in the one archive it holds. A folder with no file at all is skipped; one with files but no
    submission is an INVALID submission (the student's row says what was found). The whole
    folder is checked first (submission.unsafe_entries): a pipe, socket or device anywhere in it,
    or a link out of it (to another student's archive), refuses it before anything is read."""
    if _has_submission(folder):
        return inspect_folder(folder, id=sid)
    unsafe = unsafe_entries(folder)
    if unsafe:
        return Submission(sid, folder.absolute(), Kind.INVALID, problem=refusal(unsafe))
    visible = [p for p in sorted(folder.iterdir()) if not p.name.startswith(".") and p.name not in JUNK]
    if not visible:
        return Skipped(folder.name, "an empty folder")
    nested = [p for p in visible if p.is_dir() and _has_submission(p)]
    if len(nested) == 1:
        return inspect_folder(nested[0], id=sid)
    if len(nested) > 1:
        names = ", ".join(p.name + "/" for p in nested)
        return Submission(sid, folder.absolute(), Kind.INVALID, problem=(
            f"{folder.name}/ holds several submissions ({names}); keep one folder with "
            f"{CUDA_FILE} or {PYTHON_FILE}."))
    archives = [p for p in visible if p.is_file() and _is_archive(p.name)]
    if archive_inside and len(archives) == 1 and len(visible) == 1:
        return student_archive(archives[0], sid, scratch, limits)
    return inspect_folder(folder, id=sid)


def student_archive(archive: Path, sid: str, scratch: Path,
                    limits: config.ArchiveLimits) -> Submission:
    """A student's .zip/.tar.gz, unpacked into scratch; a broken rule is the student's verdict."""
    dest = scratch / "students" / _slug(str(archive.absolute()))   # per archive: two of one id never share it
    try:
        unpack(archive, dest, limits)
    except ArchiveRejected as e:
        return Submission(sid, archive.absolute(), Kind.INVALID, problem=(
            f"{archive.name}: {e}. Nothing of it was graded; upload a .zip or .tar.gz of your "
            f"folder with {CUDA_FILE} or {PYTHON_FILE}."))
    root = _single_top_folder(dest)
    # an archive inside is not unpacked: no chain of archives can multiply the limits
    found = student_folder(root, sid, scratch, limits, archive_inside=False) if root.is_dir() else None
    if isinstance(found, Submission):
        return found
    return Submission(sid, dest.absolute(), Kind.INVALID, problem=(
        f"{archive.name} holds no files; upload a .zip or .tar.gz of your folder with "
        f"{CUDA_FILE} or {PYTHON_FILE}."))


def canvas_student(sid: str, files: list[tuple[int, str, Path]], scratch: Path,
                   limits: config.ArchiveLimits) -> tuple[Submission, list[Skipped]]:
    """A Canvas student's flat files, gathered into a folder of their own: for each file name,
    the newest upload (highest subid); submission.cu, submission.py and an archive are one slot,
    so a student who switched from one to another is graded on the newest."""
    slots: dict[str, list[tuple[int, str, Path]]] = {}
    for subid, name, path in files:
        clean = _canvas_name(name)
        slot = "submission" if clean in (CUDA_FILE, PYTHON_FILE) or _is_archive(clean) else clean
        slots.setdefault(slot, []).append((subid, clean, path))
    skipped: list[Skipped] = []
    chosen: list[tuple[int, str, Path]] = []
    for slot, versions in sorted(slots.items()):
        versions.sort(key=lambda v: -v[0])
        chosen.append(versions[0])
        skipped += [Skipped(p.name, f"an older Canvas upload of {sid} (subid {s}); the newest, "
                                    f"subid {versions[0][0]}, is graded") for s, _, p in versions[1:]]
    main = next((c for c in chosen if c[1] in (CUDA_FILE, PYTHON_FILE) or _is_archive(c[1])), None)
    if main is not None and _is_archive(main[1]):
        others = [c for c in chosen if c is not main]
        skipped += [Skipped(p.name, f"{sid}'s newest submission is the archive {main[2].name}, "
                                    f"graded alone") for _, _, p in others]
        return student_archive(main[2], sid, scratch, limits), skipped
    dest = scratch / "canvas" / _slug(sid)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for _, name, path in chosen:
        try:   # never blocks: a regular file or nothing (the drop's own links are followed)
            data = read_regular(path, limits.max_bytes, follow_links=True)
        except NotRegular as e:
            skipped.append(Skipped(path.name, f"{e.what}: not copied"))
            continue
        except OSError as e:
            if e.errno in MACHINE_ERRNOS:
                raise
            why = f"larger than {limits.max_bytes >> 20} MiB" if e.errno == errno.EFBIG else e.strerror
            skipped.append(Skipped(path.name, f"{why}: not copied"))
            continue
        (dest / name).write_bytes(data)
        os.chmod(dest / name, 0o644)
    return inspect_folder(dest, id=sid), skipped


def _canvas_name(name: str) -> str:
    """Canvas renames a re-upload of 'submission.cu' to 'submission-1.cu'; undo that for the
    submission's own names (other files keep theirs)."""
    m = re.match(r"^(?P<stem>[^.]+)-\d+(?P<ext>\..+)$", name)
    if m and (m["stem"] + m["ext"] in (CUDA_FILE, PYTHON_FILE) or _is_archive(name)):
        return m["stem"] + m["ext"]
    return name


def _has_submission(folder: Path) -> bool:
    return (folder / CUDA_FILE).is_file() or (folder / PYTHON_FILE).is_file()


def _single_top_folder(dest: Path) -> Path:
    """An archive of a folder (`alice.zip` holding `alice/...`): that folder."""
    try:
        top = [p for p in dest.iterdir() if p.name not in JUNK and not p.name.startswith(".")]
    except OSError:
        return dest
    if len(top) == 1 and top[0].is_dir() and not _has_submission(dest):
        return top[0]
    return dest


# ---------------------------------------------------------------- Gradescope


class MetadataError(ValueError):
    """submission_metadata.yml cannot be read: the message names the line."""


def gradescope_submitters(path: Path) -> dict[str, list[dict]]:
    """{'submission_123': [{'name', 'sid', 'email'}, ...]} from Gradescope's export metadata."""
    try:   # a regular file, read without blocking, at most METADATA_BYTES
        text = read_regular(path, METADATA_BYTES, follow_links=True).decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise MetadataError(f"not UTF-8 (byte {e.start})") from None
    data = parse_yaml(text)
    if not isinstance(data, dict):
        raise MetadataError("not a mapping of submission_<id> to its submitters")
    out = {}
    for key, value in data.items():
        if not isinstance(value, dict):
            continue
        people = value.get(":submitters") or value.get("submitters") or []
        if not isinstance(people, list):
            continue
        out[str(key)] = [{str(k).lstrip(":"): v for k, v in p.items()} for p in people
                         if isinstance(p, dict)]
    return out


def _gradescope_id(submitters: list[dict] | None, folder: str) -> str:
    """Submitters' emails (a group's joined by '+'), else their SIDs, names, the folder."""
    for field in ("email", "sid", "name"):
        values = [str(p[field]).strip() for p in submitters or () if p.get(field)]
        # an id is a file name in results/, where '_' and '.' names are the grader's own
        values = [v for v in values if v and "/" not in v and "\0" not in v
                  and not v.startswith(("_", "."))]
        if values:
            return "+".join(values)
    return folder


def parse_yaml(text: str):
    """A small, safe reader of block YAML as Gradescope writes it (Ruby's Psych): mappings,
    sequences, plain and quoted scalars, scalars folded over several lines, and block scalars
    (`|`, `>`). Every scalar is a string (an SID keeps its leading zeros) or None. Tags, anchors
    and flow collections are kept as text: nothing is constructed or executed."""
    lines = []
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#") or stripped in ("---", "..."):
            continue
        if "\t" in raw[:len(raw) - len(raw.lstrip())]:
            raise MetadataError(f"line {number}: a tab in the indentation")
        lines.append((len(raw) - len(raw.lstrip(" ")), stripped, number))
    if not lines:
        return None
    value, end = _yaml_block(lines, 0, lines[0][0])
    if end != len(lines):
        raise MetadataError(f"line {lines[end][2]}: unexpected indentation")
    return value


# 'key: value' (Psych writes Ruby symbols as ':key'); the first ': ' ends the key.
_KEY = re.compile(r"^(?P<key>'(?:[^']|'')*'|\"(?:[^\"\\]|\\.)*\"|[^\s'\"#][^#]*?)\s*:(?:\s+(?P<rest>.*))?$")


def _yaml_block(lines, i, indent):
    if lines[i][1] == "-" or lines[i][1].startswith("- "):
        return _yaml_sequence(lines, i, indent)
    return _yaml_mapping(lines, i, indent)


def _yaml_mapping(lines, i, indent):
    out = {}
    while i < len(lines) and lines[i][0] == indent and not _is_item(lines[i][1]):
        _, text, number = lines[i]
        m = _KEY.match(text)
        if not m:
            raise MetadataError(f"line {number}: expected 'key: value'")
        key, rest = _yaml_scalar(m["key"]), (m["rest"] or "").strip()
        i += 1
        if rest and not rest.startswith("#"):
            out[key], i = _yaml_inline(rest, lines, i, indent)
        elif i < len(lines) and (lines[i][0] > indent or (lines[i][0] == indent and _is_item(lines[i][1]))):
            out[key], i = _yaml_block(lines, i, lines[i][0])
        else:
            out[key] = None
    return out, i


def _yaml_sequence(lines, i, indent):
    out = []
    while i < len(lines) and lines[i][0] == indent and _is_item(lines[i][1]):
        _, text, number = lines[i]
        rest = text[1:].lstrip()
        if not rest:
            i += 1
            if i < len(lines) and lines[i][0] > indent:
                value, i = _yaml_block(lines, i, lines[i][0])
            else:
                value = None
        elif _KEY.match(rest):
            # "- key: value" opens a mapping whose keys sit where 'key' does
            inner = indent + (len(text) - len(rest))
            lines = lines[:i] + [(inner, rest, number)] + lines[i + 1:]
            value, i = _yaml_mapping(lines, i, inner)
        else:
            value, i = _yaml_inline(rest, lines, i + 1, indent)
        out.append(value)
    return out, i


def _yaml_inline(rest, lines, i, indent):
    """A scalar after 'key:' or '- ', with the lines folded into it (deeper than `indent`)."""
    if re.match(r"^[|>][+-]?\d*$", rest):   # block scalar: its lines, kept as text
        body = []
        while i < len(lines) and lines[i][0] > indent:
            body.append(lines[i][1])
            i += 1
        return "\n".join(body), i
    parts = [rest]
    while i < len(lines) and lines[i][0] > indent:
        parts.append(lines[i][1])
        i += 1
    return _yaml_scalar(" ".join(parts)), i


def _yaml_scalar(text: str):
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == "'":
        return text[1:-1].replace("''", "'")
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return re.sub(r'\\(["\\/])', r"\1", text[1:-1]).replace("\\n", "\n").replace("\\t", "\t")
    text = re.split(r"\s+#", text, maxsplit=1)[0].strip()
    return None if text in ("", "~", "null", "Null", "NULL") else text


def _is_item(text: str) -> bool:
    return text == "-" or text.startswith("- ")


# ---------------------------------------------------------------- safe unpacking


def unpack(archive: Path, dest: Path, limits: config.ArchiveLimits) -> None:
    """Unpack a .zip or .tar(.gz/.bz2/.xz) into `dest` (emptied first), or raise ArchiveRejected
    and keep nothing. Rules: every member a plain file or folder (no links, devices or pipes), no
    absolute path or '..', at most `limits.max_files` members and `limits.max_bytes` unpacked
    (counted as written, whatever the headers say), and no more than `limits.max_ratio` times the
    archive's size. Files are written 0644, folders 0755. The archive itself is opened only if it
    is a regular file, without blocking (submission.open_regular): a named pipe put where an
    archive was is refused, never read."""
    try:
        fd, st = open_regular(archive, follow_links=True)   # a drop's own links are followed
    except NotRegular as e:
        raise ArchiveRejected(f"is {e.what}; remove it") from None
    with os.fdopen(fd, "rb") as raw:
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        budget = _Budget(limits, max(1, st.st_size))
        try:
            if archive.name.lower().endswith(".zip"):
                _unpack_zip(raw, dest, budget)
            else:
                _unpack_tar(archive.name, raw, dest, budget)
        except ArchiveRejected:
            shutil.rmtree(dest, ignore_errors=True)
            raise
        except OSError as e:
            shutil.rmtree(dest, ignore_errors=True)
            if e.errno in MACHINE_ERRNOS:   # the grading machine's disk or limits, not the student's
                raise
            raise ArchiveRejected(f"cannot be unpacked ({type(e).__name__}: {e})") from None
        except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError,
                ValueError, NotImplementedError, RuntimeError) as e:
            shutil.rmtree(dest, ignore_errors=True)
            raise ArchiveRejected(f"cannot be unpacked ({type(e).__name__}: {e})") from None


class _Budget:
    """Bytes and files unpacked so far, against the limits."""

    def __init__(self, limits: config.ArchiveLimits, packed: int):
        self.limits, self.packed, self.bytes, self.files = limits, packed, 0, 0

    def member(self, declared: int = 0) -> None:
        self.files += 1
        if self.files > self.limits.max_files:
            raise ArchiveRejected(f"holds more than {self.limits.max_files} files (the limit)")
        self.check(self.bytes + declared)

    def add(self, n: int) -> None:
        self.bytes += n
        self.check(self.bytes)

    def check(self, total: int) -> None:
        if total > self.limits.max_bytes:
            raise ArchiveRejected(f"unpacks to more than {_size(self.limits.max_bytes)} (the limit)")
        if total > self.limits.ratio_floor_bytes and total / self.packed > self.limits.max_ratio:
            raise ArchiveRejected(
                f"unpacks to {total / self.packed:.0f}x its size or more ({_size(total)} from "
                f"{_size(self.packed)}; the limit is {self.limits.max_ratio:.0f}x): a zip bomb?")


def _safe_path(dest: Path, name: str) -> Path | None:
    """Where member `name` goes under `dest`, or ArchiveRejected; None for the archive's root."""
    posix = name.replace("\\", "/")
    if posix.startswith("/") or re.match(r"^[A-Za-z]:", posix):
        raise ArchiveRejected(f"holds an absolute path ({name!r}); an archive's paths must stay "
                              f"inside its folder")
    parts = [p for p in PurePosixPath(posix).parts if p not in ("", ".")]
    if ".." in parts:
        raise ArchiveRejected(f"holds a path that leaves its folder ({name!r}, a zip-slip)")
    if not parts:
        return None
    if any("\x00" in p or len(p.encode("utf-8", "surrogateescape")) > 255 for p in parts):
        raise ArchiveRejected(f"holds a file name the disk cannot hold ({name[:80]!r})")
    target = dest.joinpath(*parts)
    if not str(target.resolve()).startswith(str(dest.resolve()) + os.sep):
        raise ArchiveRejected(f"holds a path that leaves its folder ({name!r})")
    return target


def _write(target: Path, stream, budget: _Budget) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "wb") as out:
        while chunk := stream.read(1 << 16):
            budget.add(len(chunk))
            out.write(chunk)
    os.chmod(target, 0o644)


def _unpack_zip(archive, dest: Path, budget: _Budget) -> None:
    with zipfile.ZipFile(archive) as zf:   # `archive`: the open file
        infos = zf.infolist()
        if len(infos) > budget.limits.max_files:
            raise ArchiveRejected(f"holds more than {budget.limits.max_files} files (the limit; "
                                  f"it holds {len(infos)})")
        budget.check(sum(i.file_size for i in infos))   # what the headers declare, before any byte
        for info in infos:
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                raise ArchiveRejected(f"holds a symbolic link ({info.filename!r}); a submission "
                                      f"is plain files: remove it")
            if info.flag_bits & 0x1:
                raise ArchiveRejected(f"is encrypted ({info.filename!r}); upload it without a password")
            target = _safe_path(dest, info.filename)
            budget.member()
            if target is None:
                continue
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            if mode and not (stat.S_ISREG(mode) or stat.S_IFMT(mode) == 0):
                raise ArchiveRejected(f"holds {info.filename!r}, {kind_of(mode)}, not a plain "
                                      f"file: remove it")
            with zf.open(info) as stream:
                _write(target, stream, budget)
    _fix_folder_modes(dest)


class _CountingReader:
    """A decompressed stream that stops at the budget: a gzip bomb is never read past it."""

    def __init__(self, raw, budget: _Budget):
        self.raw, self.budget, self.read_bytes = raw, budget, 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n if n is not None and n >= 0 else 1 << 20)
        self.read_bytes += len(data)
        # headers and padding are 512-byte blocks; allow them on top of the content
        self.budget.check(max(0, self.read_bytes - 1024 * (self.budget.files + 2) - (16 << 10)))
        return data


def _unpack_tar(name: str, archive, dest: Path, budget: _Budget) -> None:
    """`archive`: the open file of the archive called `name`."""
    name = name.lower()
    opener = (gzip.open if name.endswith((".gz", ".tgz")) else bz2.open if name.endswith(".bz2")
              else lzma.open if name.endswith(".xz") else contextlib.nullcontext)
    with opener(archive) as raw:
        with tarfile.open(fileobj=_CountingReader(raw, budget), mode="r|") as tf:
            for member in tf:
                if member.issym() or member.islnk():
                    raise ArchiveRejected(f"holds a link ({member.name!r} -> {member.linkname!r}); "
                                          f"a submission is plain files: remove it")
                if not (member.isreg() or member.isdir()):
                    raise ArchiveRejected(f"holds {member.name!r}, {_tar_kind(member)}, not a "
                                          f"plain file: remove it")
                target = _safe_path(dest, member.name)
                if hasattr(tarfile, "data_filter"):   # the standard library's own rules, too
                    try:
                        tarfile.data_filter(member, str(dest))
                    except tarfile.FilterError as e:
                        raise ArchiveRejected(f"holds an unsafe member ({e})") from None
                budget.member(member.size if member.isreg() else 0)
                if target is None:
                    continue
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                stream = tf.extractfile(member)
                _write(target, stream, budget)
    _fix_folder_modes(dest)


def _tar_kind(member: tarfile.TarInfo) -> str:
    return ("a named pipe (FIFO)" if member.isfifo() else "a character device" if member.ischr()
            else "a block device" if member.isblk() else f"a member of type {member.type!r}")


def _fix_folder_modes(dest: Path) -> None:
    for root, dirs, _ in os.walk(dest):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
    os.chmod(dest, 0o755)


# ---------------------------------------------------------------- names


def _is_archive(name: str) -> bool:
    return name.lower().endswith(ARCHIVES)


def _archive_stem(name: str) -> str:
    lower = name.lower()
    for suffix in sorted(ARCHIVES, key=len, reverse=True):
        if lower.endswith(suffix):
            return name[:-len(suffix)]
    return name


ID_BYTES = 120   # an id names files (`.<id>.json.<random>.tmp`, `logs/<id>.build.log`): < 255


def _capped(sid: str) -> str:
    """The id, or for a very long one (a group of long emails) its start and a hash of it all."""
    if len(sid.encode("utf-8", "surrogatepass")) <= ID_BYTES:
        return sid
    digest = hashlib.sha256(sid.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    head = sid.encode("utf-8", "surrogatepass")[:ID_BYTES - 14].decode("utf-8", "ignore")
    return f"{head}~{digest}"


def _slug(text: str) -> str:
    """A folder name of ASCII that no other text maps to (a readable part and a hash)."""
    readable = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    readable = re.sub(r"[^A-Za-z0-9]+", "_", readable).strip("_")[:40]
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{readable}_{digest}" if readable else digest


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"

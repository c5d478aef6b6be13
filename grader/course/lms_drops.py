"""What the LMSs deliver: Canvas's "Download submissions" flat files (name_uid_subid_file, one
student per uid, the newest upload graded) and Gradescope's export metadata (the submitters of
each submission_<id>/ folder, read by a small, safe YAML reader)."""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path

from grader.common import config
from grader.course.archives import MACHINE_ERRNOS, _is_archive, _slug
from grader.course.student_entries import Skipped, student_archive
from grader.course.submission import (CUDA_FILE, PYTHON_FILE, NotRegular, Submission, inspect_folder,
                                      read_regular)


METADATA = "submission_metadata.yml"       # Gradescope's export
METADATA_BYTES = 64 << 20                   # about 100 kB per thousand students: ample
# Canvas: {name}[_LATE]_{user id}_{attachment id}_{original file name}; a re-upload of one name
# becomes "submission-1.cu".
CANVAS = re.compile(r"^(?P<name>[^_/]+?)_(?:(?P<late>late)_)?(?P<uid>\d+)_(?P<subid>\d+)_(?P<file>.+)$",
                    re.IGNORECASE)
GRADESCOPE_FOLDER = re.compile(r"^submission_\d+$")


# ---------------------------------------------------------------- Canvas


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

"""Course drops as LMSs deliver them: every student gets a submission or a listed reason."""

from __future__ import annotations

import io
import os
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest

from grader.common import config
from grader.course.intake import DropError, open_drop
from grader.course.lms_drops import canvas_student, gradescope_submitters, parse_yaml
from grader.course.student_entries import Skipped, student_folder
from grader.course.archives import ArchiveRejected, unpack
from grader.course.submission import Kind

from .test_submission import finishes, honest, unblock

CU = "torch::Tensor flash_attention_forward(torch::Tensor Q, torch::Tensor K, torch::Tensor V) { return Q; }\n"
PY = "def custom_kernel(data):\n    return data[0]\n"

GRADESCOPE_YML = """\
---
submission_1001:
  :submitters:
  - :name: Ana García
    :sid: '001234'
    :email: ana@uni.edu
  :created_at: 2026-11-20 22:04:16.915592000 -08:00
  :score: 0.0
  :status: processed
  :results:
    :output: |-
      Thank you: your file
      was received
    :tests: []
submission_1002:
  :submitters:
  - :name: Bo Lee
    :sid: '005678'
    :email: bo@uni.edu
  - :name: Cy Dee
    :sid: '009'
    :email: cy@uni.edu
  :created_at: 2026-11-21 10:00:00.000000000 -08:00
submission_1003:
  :submitters:
  - :name: Dee Absent
    :email: dee@uni.edu
"""


def _zip(path: Path, files: dict[str, bytes | str], *, symlink: tuple[str, str] | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        if symlink:
            info = zipfile.ZipInfo(symlink[0])
            info.external_attr = (0o120777 << 16)
            zf.writestr(info, symlink[1])
    return path


def _tar(path: Path, files: dict[str, bytes | str], *, link: tuple[str, str] | None = None) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in files.items():
            data = data.encode() if isinstance(data, str) else data
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        if link:
            info = tarfile.TarInfo(link[0])
            info.type, info.linkname = tarfile.SYMTYPE, link[1]
            tf.addfile(info)
    return path


def _file(path: Path, text: str = CU) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def course(tmp_path) -> Path:
    """A drop as a course gets it, every layout at once."""
    drop = tmp_path / "drop"
    _file(drop / "alice" / "submission.cu")                        # a folder per student
    _file(drop / "bob" / "hw4" / "submission.py", PY)              # one level deeper
    _file(drop / "bob" / "hw4" / "notes.txt", "")
    _zip(drop / "carol.zip", {"carol/submission.cu": CU, "__MACOSX/carol/._submission.cu": b"\0"})
    _tar(drop / "dave.tar.gz", {"submission.py": PY})
    _file(drop / "j.smith" / "submission.cu")                      # ids that look alike
    _file(drop / "j_smith" / "submission.py", PY)
    _file(drop / "_old" / "alice" / "submission.cu")               # set aside by the instructor
    (drop / ".git").mkdir()
    (drop / "empty").mkdir()
    _file(drop / "README.txt", "instructions")
    (drop / "erin.rar").write_bytes(b"Rar!\x1a\x07\x00")
    _file(drop / "frank" / "kernel.cu")                            # misnamed: a row that says so
    # Canvas: two uploads of one student (the newest graded), a late one, a re-upload's "-1" name
    _file(drop / "garciaana_LATE_9001_501_submission.cu")
    _file(drop / "garciaana_LATE_9001_733_submission-1.cu")
    _file(drop / "leebo_9002_612_submission.py", PY)
    # Hostile archives: the student's row says what was refused
    _zip(drop / "mallory.zip", {"submission.cu": CU, "../../escaped.txt": "x"})
    _zip(drop / "oscar.zip", {"submission.cu": CU, "zeros.bin": b"\0" * (20 << 20)})   # a zip bomb
    _tar(drop / "trent.tar.gz", {"submission.py": PY}, link=("secrets", "/etc/shadow"))
    return drop


def test_a_course_drop_gives_every_student_a_submission_or_a_reason(course, tmp_path):
    drop = open_drop(course, scratch=tmp_path / "build" / "drop")
    subs = {s.id: s for s in drop.submissions}
    assert set(subs) == {"alice", "bob", "carol", "dave", "j.smith", "j_smith", "frank",
                         "garciaana_9001", "leebo_9002", "mallory", "oscar", "trent"}
    assert {"folders", "canvas"} <= set(drop.layout.split("+"))
    kinds = {sid: s.kind for sid, s in subs.items()}
    assert kinds == {"alice": Kind.CUDA, "bob": Kind.PYTHON, "carol": Kind.CUDA, "dave": Kind.PYTHON,
                     "j.smith": Kind.CUDA, "j_smith": Kind.PYTHON, "frank": Kind.INVALID,
                     "garciaana_9001": Kind.CUDA, "leebo_9002": Kind.PYTHON,
                     "mallory": Kind.INVALID, "oscar": Kind.INVALID, "trent": Kind.INVALID}
    assert subs["bob"].path.name == "hw4"
    assert "kernel.cu" in subs["frank"].problem
    # identity never collides: one build folder and module per student
    assert len({s.module_name for s in drop.submissions}) == len(drop.submissions)
    # archives are unpacked under the build folder, never beside the drop
    for sid in ("carol", "dave", "garciaana_9001"):
        assert (tmp_path / "build" / "drop") in subs[sid].path.parents
    assert not (tmp_path / "escaped.txt").exists() and not (course.parent / "escaped.txt").exists()
    # every refusal is the student's verdict, naming the rule
    assert "leaves its folder" in subs["mallory"].problem and "zip-slip" in subs["mallory"].problem
    assert "zip bomb" in subs["oscar"].problem and "100x" in subs["oscar"].problem
    assert "link" in subs["trent"].problem and "/etc/shadow" in subs["trent"].problem
    for sid in ("mallory", "oscar", "trent"):
        assert not any((tmp_path / "build" / "drop" / "students").glob(f"{sid}_*/*")), sid

    reasons = {s.entry: s.reason for s in drop.skipped}
    assert set(reasons) == {"_old/", ".git/", "empty/", "README.txt", "erin.rar",
                            "garciaana_LATE_9001_501_submission.cu"}
    assert "'_'" in reasons["_old/"] and "'.'" in reasons[".git/"]
    assert "empty folder" in reasons["empty/"] and "stray file" in reasons["README.txt"]
    assert ".zip or .tar.gz" in reasons["erin.rar"]
    assert "older Canvas upload" in reasons["garciaana_LATE_9001_501_submission.cu"] \
        and "subid 733" in reasons["garciaana_LATE_9001_501_submission.cu"]
    # the newest Canvas upload is graded under its own name
    assert (subs["garciaana_9001"].path / "submission.cu").is_file()


def test_gradescope_export_maps_folders_to_students(tmp_path):
    export = tmp_path / "assignment_77_export"
    _file(export / "submission_metadata.yml", GRADESCOPE_YML)
    _file(export / "submission_1001" / "submission.cu")
    _file(export / "submission_1002" / "flash" / "submission.py", PY)
    _file(export / "submission_1004" / "submission.cu")   # not in the metadata
    drop = open_drop(export, scratch=tmp_path / "scratch")
    subs = {s.id: s for s in drop.submissions}
    assert set(subs) == {"ana@uni.edu", "bo@uni.edu+cy@uni.edu", "submission_1004"}
    assert subs["bo@uni.edu+cy@uni.edu"].kind is Kind.PYTHON
    reasons = {s.entry: s.reason for s in drop.skipped}
    assert "not in the export" in reasons["submission_1003/"] and "dee@uni.edu" in reasons["submission_1003/"]
    assert "not in submission_metadata.yml" in reasons["submission_1004/"]
    assert drop.layout == "gradescope"


def test_the_yaml_reader_keeps_sids_as_text_and_skips_what_it_does_not_need(tmp_path):
    data = parse_yaml(GRADESCOPE_YML)
    assert data["submission_1001"][":submitters"][0] == {":name": "Ana García", ":sid": "001234",
                                                         ":email": "ana@uni.edu"}
    assert data["submission_1001"][":results"][":output"] == "Thank you: your file\nwas received"
    path = tmp_path / "m.yml"
    path.write_bytes(b"\xef\xbb\xbf" + GRADESCOPE_YML.encode())   # a BOM is fine
    people = gradescope_submitters(path)
    assert [p["email"] for p in people["submission_1002"]] == ["bo@uni.edu", "cy@uni.edu"]
    assert people["submission_1003"] == [{"name": "Dee Absent", "email": "dee@uni.edu"}]


def test_unreadable_gradescope_metadata_is_listed_and_folders_still_graded(tmp_path):
    export = tmp_path / "export"
    _file(export / "submission_metadata.yml", "submission_1:\n\t:submitters: x\n")
    _file(export / "submission_1" / "submission.cu")
    drop = open_drop(export, scratch=tmp_path / "s")
    assert [s.id for s in drop.submissions] == ["submission_1"]
    assert "tab" in drop.skipped[0].reason and drop.skipped[0].entry == "submission_metadata.yml"


@pytest.mark.parametrize("kind", ["zip", "tar.gz"])
def test_a_whole_drop_may_be_one_archive(tmp_path, kind):
    files = {"course/alice/submission.cu": CU, "course/bob.zip": b"", "course/_x/submission.cu": CU}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("bob/submission.py", PY)
    files["course/bob.zip"] = buf.getvalue()
    archive = (_zip if kind == "zip" else _tar)(tmp_path / f"course.{kind}", files)
    drop = open_drop(archive, scratch=tmp_path / "build" / "drop")
    assert {s.id: s.kind for s in drop.submissions} == {"alice": Kind.CUDA, "bob": Kind.PYTHON}
    assert [s.entry for s in drop.skipped] == ["_x/"]


def test_one_students_archive_is_one_submission_named_after_it(tmp_path):
    archive = _zip(tmp_path / "ana.zip", {"submission.py": PY})
    [sub] = open_drop(archive, scratch=tmp_path / "s").submissions
    assert sub.id == "ana" and sub.kind is Kind.PYTHON


def test_a_hostile_drop_archive_is_an_error_not_a_crash(tmp_path):
    archive = _zip(tmp_path / "drop.zip", {"a/submission.cu": CU, "/abs/x": "x"})
    with pytest.raises(DropError, match=r"drop.zip: holds an absolute path"):
        open_drop(archive, scratch=tmp_path / "s")
    (tmp_path / "bad.zip").write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(DropError, match=r"bad.zip: cannot be unpacked"):
        open_drop(tmp_path / "bad.zip", scratch=tmp_path / "s")


def test_zero_gradable_submissions_is_an_error_that_lists_why(tmp_path):
    drop = tmp_path / "drop"
    _file(drop / "hw4" / "alice" / "submission.cu")   # one level too high: SUBMISSIONS=drop/hw4
    _file(drop / "hw4" / "bob" / "submission.cu")
    _file(drop / "_old" / "submission.cu")
    with pytest.raises(DropError) as e:
        open_drop(drop, scratch=tmp_path / "s")
    text = str(e.value)
    assert "no gradable submission" in text and "several submissions (alice/, bob/)" in text
    assert "_old/" in text
    (tmp_path / "nothing").mkdir()
    with pytest.raises(DropError, match="the folder is empty"):
        open_drop(tmp_path / "nothing", scratch=tmp_path / "s")
    with pytest.raises(DropError, match="no such folder"):
        open_drop(tmp_path / "absent", scratch=tmp_path / "s")


def test_a_folder_and_an_archive_of_one_name_grade_the_newer(tmp_path):
    drop = tmp_path / "drop"
    _file(drop / "alice" / "submission.cu")
    _zip(drop / "alice.zip", {"submission.py": PY})
    os.utime(drop / "alice", (1_000_000, 1_000_000))   # the folder is older
    d = open_drop(drop, scratch=tmp_path / "s")
    [sub] = d.submissions
    assert sub.id == "alice" and sub.kind is Kind.PYTHON
    assert d.skipped == (Skipped("alice/", "the same student id 'alice' as alice.zip, which is "
                                           "newer and is graded"),)


@pytest.mark.parametrize("files, fragment", [
    ({"a/../../x": "x"}, "zip-slip"),
    ({"/etc/cron.d/x": "x"}, "absolute path"),
    ({"C:/windows/x": "x"}, "absolute path"),
    ({f"f{i}.cu": "" for i in range(30)}, "more than 20 files"),
    ({"big.bin": os.urandom(300_000)}, "more than 256.0 KiB"),
])
def test_unpack_rules(tmp_path, files, fragment):
    limits = config.ArchiveLimits(max_bytes=256 << 10, max_files=20, ratio_floor_bytes=1 << 20)
    for kind, make in (("zip", _zip), ("tar.gz", _tar)):
        if kind == "tar.gz" and any(k.startswith("C:") for k in files):
            continue   # a tar member name 'C:/...' is a relative path on POSIX
        archive = make(tmp_path / f"a.{kind}", files)
        dest = tmp_path / f"out-{kind}"
        with pytest.raises(Exception, match=fragment.replace("(", r"\(").replace(".", r"\.")):
            unpack(archive, dest, limits)
        assert not dest.exists(), kind


def test_a_zip_whose_headers_lie_is_refused_and_nothing_kept(tmp_path):
    """Declared sizes patched down to 10 bytes: the bytes are what count, never the headers."""
    archive = _zip(tmp_path / "lying.zip", {"big.bin": b"\0" * (3 << 20)})
    data = bytearray(archive.read_bytes())
    for sig, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        at = data.find(sig)
        data[at + offset:at + offset + 4] = (10).to_bytes(4, "little")
    archive.write_bytes(bytes(data))
    limits = config.ArchiveLimits(max_bytes=1 << 20, max_files=10, ratio_floor_bytes=64 << 20)
    with pytest.raises(Exception, match="cannot be unpacked|more than 1.0 MiB"):
        unpack(archive, tmp_path / "out", limits)
    assert not (tmp_path / "out").exists()


def test_a_gzip_bomb_inside_a_tar_is_stopped_while_it_is_read(tmp_path):
    """A tar.gz is read as a stream: the budget stops decompression, not the end of the file."""
    archive = _tar(tmp_path / "bomb.tar.gz", {f"z{i}.bin": b"\0" * (2 << 20) for i in range(8)})
    limits = config.ArchiveLimits(max_bytes=64 << 20, max_files=100, max_ratio=100,
                                  ratio_floor_bytes=1 << 20)
    with pytest.raises(Exception, match="zip bomb"):
        unpack(archive, tmp_path / "out", limits)
    assert not (tmp_path / "out").exists()


def test_unpacked_files_are_readable_by_the_sandbox_user(tmp_path):
    archive = _zip(tmp_path / "a.zip", {"d/submission.py": PY})
    unpack(archive, tmp_path / "out", config.STUDENT_ARCHIVE)
    assert (tmp_path / "out" / "d" / "submission.py").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "out" / "d").stat().st_mode & 0o777 == 0o755


def test_links_in_a_zip_are_refused(tmp_path):
    archive = _zip(tmp_path / "l.zip", {"submission.cu": CU}, symlink=("evil", "../../../etc/passwd"))
    with pytest.raises(Exception, match="symbolic link"):
        unpack(archive, tmp_path / "out", config.STUDENT_ARCHIVE)
    assert not (tmp_path / "out").exists()


def _grader(*args):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "grader", *args], capture_output=True, text=True,
                          cwd=config.REPO_ROOT, timeout=600)


def test_grading_a_drop_gives_rows_and_lists_the_rest(tmp_path):
    """Through the command line: each student a result file, each other entry a printed and
    recorded reason; a drop with nothing to grade is exit status 2."""
    import json
    drop = tmp_path / "drop"
    _zip(drop / "ana.zip", {"ana/submission.py": "def custom_kernel(data)\n"})   # a syntax error
    _zip(drop / "mallory.zip", {"../evil.py": "x"})
    _file(drop / "_old" / "submission.py", PY)
    _file(drop / "notes.md", "")
    cases = tmp_path / "cases.txt"
    cases.write_text("batch_size: 1; num_heads: 1; seq_len: 1; head_dim: 64; seed: 1\n")
    out = tmp_path / "results"
    proc = _grader("grade", str(drop), "--out", str(out), "--build-dir", str(tmp_path / "build"),
                   "--cases", str(cases), "--no-hidden", "--cpu", "--no-solution")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "ana.json").read_text())["status"] == "build_error"
    mallory = json.loads((out / "mallory.json").read_text())
    assert mallory["status"] == "build_error" and "zip-slip" in mallory["message"]
    assert "not graded: _old/: set aside" in proc.stderr and "not graded: notes.md: a stray file" in proc.stderr
    run = json.loads((out / "_run.json").read_text())
    assert {s["entry"] for s in run["skipped"]} == {"_old/", "notes.md"}

    (drop / "ana.zip").unlink()
    (drop / "mallory.zip").unlink()
    proc = _grader("grade", str(drop), "--out", str(tmp_path / "r2"), "--build-dir",
                   str(tmp_path / "build"), "--cases", str(cases), "--no-hidden", "--cpu")
    assert proc.returncode == 2 and "no gradable submission" in proc.stderr
    assert "_old/: set aside" in proc.stderr and "Traceback" not in proc.stderr


def test_a_very_long_id_is_capped_to_a_file_name_and_stays_unique():
    from grader.course.intake import ID_BYTES, _capped
    group = "+".join(f"student.with.a.long.name{i}@cs.university-of-somewhere.edu" for i in range(5))
    other = group.replace("name4", "name5")
    a, b = _capped(group), _capped(other)
    assert len(a.encode()) <= ID_BYTES and len(b.encode()) <= ID_BYTES and a != b
    assert a.startswith("student.with.a.long.name0@") and _capped("alice") == "alice"
    assert len(_capped("é" * 200).encode()) <= ID_BYTES


def test_a_second_run_never_unpacks_over_the_drop_a_first_is_grading(tmp_path):
    from grader.course.locks import RunLock
    drop = tmp_path / "drop"
    _zip(drop / "ana.zip", {"ana/submission.py": PY})
    build = tmp_path / "build"
    held = RunLock(build / ".drop.lock", "a first run's drop")
    held.acquire()   # the first run, still grading from build/drop
    try:
        proc = _grader("grade", str(drop), "--out", str(tmp_path / "r"), "--build-dir", str(build),
                       "--no-hidden", "--cpu", "--no-solution")
        assert proc.returncode == 2 and "in use by another grading run" in proc.stderr
        assert not (build / "drop").exists() and "Traceback" not in proc.stderr
    finally:
        held.release()


# ---------------------------------------------------------------- special files (issue 30)


def _special_members(kind: str) -> dict[str, tuple[str, str]]:
    """Archive members that are not plain files: name -> (what it is, the text its refusal has)."""
    members = {"fifo": ("helper.py", "a named pipe (FIFO)"),
               "device": ("null", "a character device"),
               "zero": ("data.bin", "link"), "other": ("submission.py", "link"),
               "passwd": ("notes.txt", "link")}
    if kind == "tar.gz":
        members["hard"] = ("copy.py", "link")
    return members


def _hostile_tar(path: Path, special: str) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in {"submission.py": PY, "helper.py": PY}.items():
            if special in ("fifo", "other", "hard") and name == _special_members("tar.gz")[special][0]:
                continue
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data.encode()))
        info = tarfile.TarInfo(_special_members("tar.gz")[special][0])
        if special == "fifo":
            info.type = tarfile.FIFOTYPE
        elif special == "device":
            info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
        elif special == "hard":
            info.type, info.linkname = tarfile.LNKTYPE, "/etc/passwd"
        else:
            info.type = tarfile.SYMTYPE
            info.linkname = {"zero": "/dev/zero", "other": "../other_student/submission.py",
                             "passwd": "/etc/passwd"}[special]
        tf.addfile(info)
    return path


def _hostile_zip(path: Path, special: str) -> Path:
    name = _special_members("zip")[special][0]
    files = {n: PY for n in ("submission.py", "helper.py") if n != name}
    _zip(path, files)
    with zipfile.ZipFile(path, "a") as zf:
        info = zipfile.ZipInfo(name)
        if special == "fifo":
            info.external_attr = (stat.S_IFIFO | 0o644) << 16
        elif special == "device":
            info.external_attr = (stat.S_IFCHR | 0o644) << 16
        else:
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
        target = {"zero": "/dev/zero", "other": "../other_student/submission.py",
                  "passwd": "/etc/passwd"}.get(special, "")
        zf.writestr(info, target)
    return path


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
def test_an_archive_with_a_pipe_a_device_or_a_link_is_refused_naming_it(tmp_path, kind):
    """A student's archive and a whole drop's: nothing of one that holds a pipe, a device or a
    link is unpacked; the student's row names the member and the fix, the drop's error too."""
    make = _hostile_tar if kind == "tar.gz" else _hostile_zip
    for special, (name, what) in _special_members(kind).items():
        drop = tmp_path / special / "drop"
        drop.mkdir(parents=True)
        make(drop / f"mallory.{kind}", special)
        _zip(drop / "alice.zip", {"alice/submission.py": PY})   # the honest twin, beside it
        dropped = finishes(open_drop, drop, scratch=tmp_path / special / "build")
        subs = {s.id: s for s in dropped.submissions}
        assert subs["alice"].kind is Kind.PYTHON, special
        mallory = subs["mallory"]
        assert mallory.kind is Kind.INVALID, special
        assert repr(name) in mallory.problem and what in mallory.problem, mallory.problem
        assert "remove it" in mallory.problem, mallory.problem
        kept = [p for p in (tmp_path / special / "build").rglob("*") if not p.is_dir()]
        assert [p.parent.name for p in kept] == ["alice"], (special, kept)   # nothing of mallory's
        with pytest.raises(DropError, match=what.replace("(", r"\(").replace(")", r"\)")):
            open_drop(drop / f"mallory.{kind}", scratch=tmp_path / special / "whole")


def test_a_drop_folder_with_pipes_and_links_out_grades_everyone_else(tmp_path):
    """A named pipe or a link out of the folder anywhere in a student's folder (top, nested, or
    an archive that is a link to another student's) refuses that student, names the entry, and
    every other student is still read: nothing blocks."""
    drop = tmp_path / "drop"
    honest(drop / "alice")
    _zip(drop / "alice" / "alice.zip", {"submission.py": PY})
    honest(drop / "mallory")
    os.mkfifo(drop / "mallory" / "helper.py.fifo")
    honest(drop / "nick" / "hw4")
    os.mkfifo(drop / "nick" / "notes")                               # beside the nested folder
    (drop / "oscar").mkdir()
    (drop / "oscar" / "oscar.zip").symlink_to("../alice/alice.zip")   # another student's archive
    honest(drop / "peggy")
    (drop / "peggy" / "submission.py").unlink()
    (drop / "peggy" / "submission.py").symlink_to("../alice/submission.py")
    os.mkfifo(drop / "stray")                                        # the drop's own: listed
    dropped = finishes(open_drop, drop, scratch=tmp_path / "build", folder=drop)
    subs = {s.id: s for s in dropped.submissions}
    assert subs["alice"].kind is Kind.PYTHON   # the honest twin: its own archive beside it is a file
    problems = {sid: subs[sid].problem for sid in ("mallory", "nick", "oscar", "peggy")}
    assert all(subs[sid].kind is Kind.INVALID for sid in problems), problems
    assert "helper.py.fifo: a named pipe (FIFO)" in problems["mallory"]
    assert "notes: a named pipe (FIFO)" in problems["nick"]
    assert "oscar.zip: a symbolic link to '../alice/alice.zip', outside" in problems["oscar"]
    assert "submission.py: a symbolic link to '../alice/submission.py', outside" in problems["peggy"]
    assert {s.entry for s in dropped.skipped} == {"stray"}


def test_readers_of_a_drop_never_block_on_a_pipe_put_where_a_file_was(tmp_path):
    """The second line, for what intake itself reads (a folder changed after it was listed):
    an archive, Gradescope's metadata and a Canvas upload that are pipes are refused, not read."""
    os.mkfifo(tmp_path / "a.zip")
    with pytest.raises(ArchiveRejected, match=r"is a named pipe \(FIFO\), not a regular file; remove it"):
        finishes(unpack, tmp_path / "a.zip", tmp_path / "out", config.STUDENT_ARCHIVE, folder=tmp_path)
    os.mkfifo(tmp_path / "submission_metadata.yml")
    with pytest.raises(OSError):
        finishes(gradescope_submitters, tmp_path / "submission_metadata.yml", folder=tmp_path)
    os.mkfifo(tmp_path / "ana_1_2_helper.py")
    _file(tmp_path / "ana_1_2_submission.py", PY)
    uploads = [(2, "helper.py", tmp_path / "ana_1_2_helper.py"),
               (2, "submission.py", tmp_path / "ana_1_2_submission.py")]
    sub, skipped = finishes(canvas_student, "ana_1", uploads, tmp_path / "scratch",
                            config.STUDENT_ARCHIVE, folder=tmp_path)
    assert sub.kind is Kind.PYTHON
    assert [s.reason for s in skipped] == ["a named pipe (FIFO), not a regular file: not copied"]


def test_a_student_folder_holding_one_archive_is_checked_before_it_is_unpacked(tmp_path):
    folder = tmp_path / "drop" / "oscar"
    folder.mkdir(parents=True)
    _zip(tmp_path / "drop" / "bob" / "bob.zip", {"submission.py": PY})
    (folder / "oscar.zip").symlink_to(tmp_path / "drop" / "bob" / "bob.zip")
    found = student_folder(folder, "oscar", tmp_path / "build", config.STUDENT_ARCHIVE)
    assert found.kind is Kind.INVALID and "oscar.zip: a symbolic link" in found.problem
    assert not (tmp_path / "build").exists()   # bob's archive was never unpacked as oscar's


def test_grading_goes_on_past_a_folder_with_a_named_pipe(tmp_path):
    """Through the command line, as `make adversarial` grades tests/adversarial/named_pipe_py:
    the run finishes, the student with the pipe gets build_error naming it, the others a row."""
    import json
    import subprocess
    import sys
    drop = tmp_path / "drop"
    honest(drop / "alice")
    honest(drop / "mallory")
    (drop / "mallory" / "helper.py").unlink()
    (drop / "mallory" / "submission.py").write_text(PY)
    os.mkfifo(drop / "mallory" / "helper.py")
    cases = tmp_path / "cases.txt"
    cases.write_text("batch_size: 1; num_heads: 1; seq_len: 1; head_dim: 64; seed: 1\n")
    out = tmp_path / "results"
    try:
        proc = subprocess.run([sys.executable, "-m", "grader", "grade", str(drop), "--out", str(out),
                               "--build-dir", str(tmp_path / "build"), "--cases", str(cases),
                               "--no-hidden", "--cpu", "--no-solution", "--no-baselines"],
                              capture_output=True, text=True, cwd=config.REPO_ROOT, timeout=300)
    except subprocess.TimeoutExpired:
        unblock(drop)
        pytest.fail("the grader hung on a named pipe in a submission folder")
    assert proc.returncode == 0, proc.stderr[-3000:]
    mallory = json.loads((out / "mallory.json").read_text())
    assert mallory["status"] == "build_error"
    assert "helper.py: a named pipe (FIFO)" in mallory["message"] and "Remove them" in mallory["message"]
    assert json.loads((out / "alice.json").read_text())["status"] != "build_error"

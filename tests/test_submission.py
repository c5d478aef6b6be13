import pytest

from grader.course.intake import DropError
from grader.course.submission import Kind, inspect_folder
from grader.course.intake import discover


def test_kinds_and_invalid_folders(tmp_path):
    (tmp_path / "cuda_one").mkdir()
    (tmp_path / "cuda_one" / "submission.cu").write_text("// x")
    (tmp_path / "py_one").mkdir()
    (tmp_path / "py_one" / "submission.py").write_text("")
    (tmp_path / "both").mkdir()
    (tmp_path / "both" / "submission.cu").write_text("")
    (tmp_path / "both" / "submission.py").write_text("")
    (tmp_path / "neither").mkdir()
    (tmp_path / "neither" / "kernel.cu").write_text("")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "notes.txt").write_text("")
    subs = {s.id: s for s in discover(tmp_path, scratch=tmp_path / ".scratch")}
    assert set(subs) == {"both", "cuda_one", "neither", "py_one"}
    assert subs["cuda_one"].kind is Kind.CUDA and subs["py_one"].kind is Kind.PYTHON
    assert subs["both"].kind is Kind.INVALID and "both submission.cu and submission.py" in subs["both"].problem
    assert subs["neither"].kind is Kind.INVALID and "kernel.cu" in subs["neither"].problem
    assert "Name your file exactly submission.cu" in subs["neither"].problem


def test_a_single_submission_folder_is_its_own_list(tmp_path):
    (tmp_path / "submission.py").write_text("")
    [sub] = discover(tmp_path)
    assert sub.kind is Kind.PYTHON and sub.id == tmp_path.name


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(DropError, match="no such folder of submissions"):
        discover(tmp_path / "absent")


def test_module_name_is_an_identifier(tmp_path):
    sub = inspect_folder(tmp_path / "a-b.c d")
    assert sub.module_name.isidentifier()


# ---------------------------------------------------------------- a folder is read safely (issue 30)


import os
import socket
import stat
import threading
import time
from pathlib import Path

from grader.course import submission
from grader.course.submission import folder_digest
from grader.course.submission import (NotRegular, open_regular, read_regular, read_sources,
                               split_sources, unsafe_entries)

GOOD = "from helper import custom_kernel  # noqa: F401\n"
HELPER = "def custom_kernel(data):\n    return data[0]\n"
LIMIT_S = 10.0   # each call below takes milliseconds; a blocked read would take forever


def unblock(folder: Path) -> None:
    """Free a thread blocked opening a named pipe under `folder` for reading: open the writing
    end (it opens only while a reader waits) and close it, so the reader sees the pipe's end."""
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            if stat.S_ISFIFO(os.lstat(path).st_mode):
                try:
                    os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
                except OSError:
                    pass


def finishes(fn, *args, folder: Path | None = None, seconds: float = LIMIT_S, **kwargs):
    """fn(*args, **kwargs), which must return within `seconds`: a read that blocks fails the test
    instead of hanging it (the call runs in a thread; the pipes under `folder` are then unblocked
    so that no thread is left behind)."""
    out: dict = {}

    def call():
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as e:   # handed to the test's thread
            out["error"] = e
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        if folder is not None:
            unblock(folder)
        thread.join(5)
        pytest.fail(f"{fn.__name__} blocked for more than {seconds:.0f} s")
    if "error" in out:
        raise out["error"]
    return out["value"]


def honest(folder: Path) -> Path:
    """A good Python submission: submission.py and the helper it imports."""
    folder.mkdir(parents=True)
    (folder / "submission.py").write_text(GOOD)
    (folder / "helper.py").write_text(HELPER)
    return folder


def _fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def _socket(path: Path) -> socket.socket:
    here = os.getcwd()
    os.chdir(path.parent)   # a relative name: a Unix socket's path is limited to 108 bytes
    try:
        s = socket.socket(socket.AF_UNIX)
        s.bind(path.name)
    finally:
        os.chdir(here)
    return s


def _device(path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("a device node needs root")
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))   # /dev/null's numbers
    except PermissionError:
        pytest.skip("this machine allows no device node here")


def _other_student(folder: Path) -> Path:
    other = honest(folder.parent / "other_student")
    return other / "submission.py"


# Each attack: what it puts in a good submission's folder, and the entry the refusal names.
ATTACKS = {
    "fifo named submission.py": (lambda f: _fifo(f / "submission.py"),
                                 "submission.py: a named pipe (FIFO)"),
    "fifo named helper.py": (lambda f: _fifo(f / "helper.py"), "helper.py: a named pipe (FIFO)"),
    "fifo in a hidden folder": (lambda f: ((f / ".git").mkdir(), _fifo(f / ".git" / "HEAD")),
                                ".git/HEAD: a named pipe (FIFO)"),
    "unix socket": (lambda f: _socket(f / "s.sock"), "s.sock: a Unix socket"),
    "link to /dev/zero": (lambda f: (f / "data.bin").symlink_to("/dev/zero"),
                          "data.bin: a symbolic link to '/dev/zero', outside the submission's folder"),
    "link to /dev/urandom": (lambda f: (f / "helper.py").unlink() or
                             (f / "helper.py").symlink_to("/dev/urandom"),
                             "helper.py: a symbolic link to '/dev/urandom', outside"),
    "link to another student": (lambda f: (f / "submission.py").unlink() or
                                (f / "submission.py").symlink_to(
                                    os.path.relpath(_other_student(f), f)),
                                "submission.py: a symbolic link to '../other_student/submission.py', "
                                "outside"),
    "link to /etc/passwd": (lambda f: (f / "notes.txt").symlink_to("/etc/passwd"),
                            "notes.txt: a symbolic link to '/etc/passwd', outside"),
    "dangling link": (lambda f: (f / "gone.h").symlink_to("missing.h"),
                      "gone.h: a symbolic link to 'missing.h', which points to nothing"),
    "link loop": (lambda f: (f / "a.h").symlink_to("a.h"),
                  "a.h: a symbolic link to 'a.h', which is a loop"),
    "link to a pipe inside": (lambda f: (_fifo(f / "p"), (f / "q.py").symlink_to("p")),
                              "q.py: a symbolic link to 'p', a named pipe (FIFO)"),
    "device node": (lambda f: _device(f / "null"), "null: a character device"),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_pipe_socket_device_or_link_out_is_refused_at_intake_and_nothing_blocks(tmp_path, attack):
    """Issue 30: a named pipe in a folder hung the whole run (folder_digest and read_sources
    opened it in the grader's own process). Now the folder is refused with the entry and the fix
    named, and even where a reader meets it (a folder changed after intake), nothing blocks."""
    make, named = ATTACKS[attack]
    folder = honest(tmp_path / "student")
    keep = make(folder)
    sub = finishes(inspect_folder, folder, folder=folder)
    assert sub.kind is Kind.INVALID, sub
    assert named in sub.problem and "Remove them" in sub.problem, sub.problem
    assert sub.problem.splitlines()[0].endswith(":")   # the verdict's headline names the entry
    # the second line: each reader in the grader's own process returns, without blocking
    sources = split_sources(finishes(read_sources, folder, folder=folder))
    assert set(sources) <= {"submission.py", "helper.py"}
    assert len(finishes(folder_digest, folder, folder=folder)) == 16
    if isinstance(keep, socket.socket):
        keep.close()


def test_the_honest_twins_pass_intake_a_plain_folder_and_links_inside_it(tmp_path):
    """Links that stay inside the folder are allowed (git keeps them; they read nothing the folder
    does not hold); a hidden folder of plain files is fine."""
    plain = honest(tmp_path / "plain")
    assert inspect_folder(plain).kind is Kind.PYTHON and unsafe_entries(plain) == []
    linked = honest(tmp_path / "linked")
    (linked / "lib").mkdir()
    (linked / "lib" / "real.cuh").write_text("// a header\n")
    (linked / "kernel.cuh").symlink_to("lib/real.cuh")           # to a file inside
    (linked / "include").symlink_to("lib")                       # to a folder inside
    (linked / "abs.cuh").symlink_to(linked / "lib" / "real.cuh")  # absolute, still inside
    (linked / ".git").mkdir()
    (linked / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    sub = inspect_folder(linked)
    assert sub.kind is Kind.PYTHON and sub.problem == "" and unsafe_entries(linked) == []
    # the readers never follow a link: its target is read under its own name
    assert set(split_sources(read_sources(linked))) == {"submission.py", "helper.py", "lib/real.cuh"}


def test_a_link_out_of_a_symlinked_submission_folder_is_still_out(tmp_path):
    """The folder is compared as it resolves: a student folder that is itself a link (the
    instructor's drop) keeps links inside it allowed and links out of it refused."""
    real = honest(tmp_path / "real" / "alice")
    (real / "k.cuh").symlink_to("helper.py")
    (tmp_path / "drop").mkdir()
    (tmp_path / "drop" / "alice").symlink_to(real)
    assert inspect_folder(tmp_path / "drop" / "alice").kind is Kind.PYTHON
    (real / "out.py").symlink_to("../../drop")   # resolves to tmp_path/drop: outside alice
    assert "out.py: a symbolic link" in inspect_folder(tmp_path / "drop" / "alice").problem


def test_too_many_entries_to_check_is_refused_not_waved_through(tmp_path):
    folder = honest(tmp_path / "many")
    for i in range(30):
        (folder / f"f{i}.txt").write_text("")
    assert unsafe_entries(folder, limit=100) == []
    [entry] = unsafe_entries(folder, limit=20)
    assert "more than 20 files and folders" in entry.what


def test_a_refusal_shows_names_as_text_not_as_terminal_codes(tmp_path):
    folder = honest(tmp_path / "s")
    _fifo(folder / "x\x1b[2Jy.py")
    problem = inspect_folder(folder).problem
    assert "\x1b" not in problem and "x\\x1b[2Jy.py: a named pipe" in problem


def test_open_regular_never_opens_a_pipe_a_device_or_a_link(tmp_path):
    _fifo(tmp_path / "pipe")
    (tmp_path / "file").write_text("text")
    (tmp_path / "link").symlink_to("file")
    for name in ("pipe", "link"):
        with pytest.raises(NotRegular):
            finishes(open_regular, tmp_path / name, folder=tmp_path)
    with pytest.raises(NotRegular):
        finishes(open_regular, "/dev/zero", follow_links=True)
    assert finishes(read_regular, tmp_path / "link", 100, follow_links=True) == b"text"
    assert read_regular(tmp_path / "file", 4) == b"text"
    with pytest.raises(OSError, match="larger than 3 bytes"):
        read_regular(tmp_path / "file", 3)


def test_a_pipe_swapped_in_after_the_look_is_opened_without_blocking_and_refused(tmp_path, monkeypatch):
    """The race intake cannot close: the entry was a regular file when looked at and is a pipe
    when opened. O_NONBLOCK opens the pipe at once (no writer needed) and fstat refuses it."""
    from grader.course import submission
    (tmp_path / "file").write_text("x")
    _fifo(tmp_path / "pipe")
    looked = os.stat(tmp_path / "file")
    real_stat = os.stat
    monkeypatch.setattr(submission.os, "stat",
                        lambda p, **kw: looked if str(p).endswith("pipe") else real_stat(p, **kw))
    with pytest.raises(NotRegular, match="changed while it was opened"):
        finishes(open_regular, tmp_path / "pipe", folder=tmp_path)


def test_folder_digest_reads_no_more_than_its_cap_and_still_sees_a_change(tmp_path, monkeypatch):
    """A sparse 1 TiB file (it costs no disk) is keyed by its size, inode and change time, never
    read: the old digest read every byte of it."""
    folder = honest(tmp_path / "s")
    with open(folder / "huge.bin", "wb") as f:
        f.truncate(1 << 40)
    first = finishes(folder_digest, folder)
    assert first == folder_digest(folder)
    monkeypatch.setattr(submission, "DIGEST_CONTENT_BYTES", 100)
    (folder / "big.txt").write_text("a" * 200)
    before = folder_digest(folder)
    time.sleep(0.05)   # the change time's clock ticks every few milliseconds
    (folder / "big.txt").write_text("b" * 200)
    assert folder_digest(folder) != before


def test_folder_digest_tells_a_pipe_from_a_file_and_hashes_a_link_to_a_folder(tmp_path):
    a, b = honest(tmp_path / "a"), honest(tmp_path / "b")
    (a / "x").write_text("")
    _fifo(b / "x")
    assert folder_digest(a) != finishes(folder_digest, b, folder=b)
    (a / "lib").mkdir()
    before = folder_digest(a)
    (a / "inc").symlink_to("lib")
    assert folder_digest(a) != before   # a link to a folder is content too


def test_the_source_shown_in_feedback_is_read_safely(tmp_path):
    """submission.source_text (the lead's folders.read_source_text is to call it): the file's text,
    capped; through a link inside the folder; never through one out of it; never a pipe."""
    from grader.course.submission import source_text
    folder = honest(tmp_path / "s")
    sub = inspect_folder(folder)
    assert source_text(sub) == GOOD and source_text(sub, limit=5) is None
    (folder / "submission.py").rename(folder / "real.py")
    (folder / "submission.py").symlink_to("real.py")
    assert source_text(sub) == GOOD
    (folder / "submission.py").unlink()
    (folder / "submission.py").symlink_to(_other_student(folder))
    assert source_text(sub) is None
    (folder / "submission.py").unlink()
    _fifo(folder / "submission.py")
    assert finishes(source_text, sub, folder=folder) is None

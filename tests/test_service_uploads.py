"""What the check service accepts (issue 33, grader/service/uploads.py): a submission folder's
archive within the course's limits; traversal, links, bombs, oversize and non-archives refused
with a status and a reason, nothing kept."""

from __future__ import annotations

import io
import tarfile
import zipfile

import pytest

from grader.service.uploads import check_upload

MB = 1 << 20


def zipped(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return out.getvalue()


def tarred(members: list[tarfile.TarInfo], data: dict[str, bytes] | None = None) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as t:
        for m in members:
            payload = (data or {}).get(m.name)
            if payload is not None:
                m.size = len(payload)
            t.addfile(m, io.BytesIO(payload) if payload is not None else None)
    return out.getvalue()


def test_a_submission_folder_is_accepted_at_its_root_or_in_its_one_top_folder():
    assert check_upload(zipped({"submission.py": b"def custom_kernel(d): ..."}),
                        max_bytes=4 * MB).kind == "python"
    nested = check_upload(zipped({"alice/submission.cu": b"// kernel", "alice/notes.md": b"x"}),
                          max_bytes=4 * MB)
    assert nested.ok and nested.kind == "cuda"
    member = tarfile.TarInfo("submission.cu")
    assert check_upload(tarred([member], {"submission.cu": b"// k"}), max_bytes=MB).kind == "cuda"


def _link(name: str, target: str) -> tarfile.TarInfo:
    m = tarfile.TarInfo(name)
    m.type, m.linkname = tarfile.SYMTYPE, target
    return m


@pytest.mark.parametrize("upload, status, said", [
    (lambda: zipped({"../evil.py": b"x", "submission.py": b"x"}), 400, "leaves its folder"),
    (lambda: tarred([_link("submission.py", "/etc/passwd")]), 400, "the archive holds a link"),
    (lambda: zipped({"submission.py": b"\0" * (200 * MB)}), 400, "unpacks to more than"),
    (lambda: b"just some text, not an archive", 415, "not a .zip or .tar.gz"),
    (lambda: zipped({"notes.md": b"x"}), 422, "has neither submission.cu nor submission.py"),
    (lambda: zipped({"submission.cu": b"x", "submission.py": b"x"}), 422, "has both"),
])
def test_a_bad_upload_is_refused_with_its_status_and_reason(upload, status, said):
    got = check_upload(upload(), max_bytes=4 * MB)
    assert (got.status, got.ok) == (status, False) and said in got.reason, got
    assert "/tmp" not in got.reason   # the grading machine's paths are not the student's business


def test_an_oversized_upload_is_refused_before_it_is_opened():
    got = check_upload(b"PK\x03\x04" + b"\0" * (2 * MB), max_bytes=MB)
    assert got.status == 413 and "at most 1.0 MB" in got.reason and "upload_mb" in got.reason

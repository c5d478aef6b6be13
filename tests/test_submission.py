import pytest

from grader.intake import DropError
from grader.submission import Kind, discover, inspect_folder


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

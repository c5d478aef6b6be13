import pytest

from grader import config
from grader.cases import Case, CaseFileError, largest, load_all_cases, load_cases, parse_case_line


def test_public_cases_are_exactly_the_three_cs149_lines():
    cases = load_cases(config.PUBLIC_CASES)
    assert [c.shape for c in cases] == [(1, 64, 1024, 128), (2, 64, 4096, 128), (4, 64, 8192, 128)]
    assert {c.seed for c in cases} == {1118}
    assert all(not c.hidden for c in cases)


def test_hidden_cases_are_awkward():
    hidden = load_cases(config.HIDDEN_CASES, hidden=True)
    assert all(c.hidden for c in hidden)
    assert any(c.seq_len == 1 for c in hidden)
    assert any(c.head_dim == 64 for c in hidden)
    assert any(c.seq_len % 64 and c.seq_len > 1000 for c in hidden)
    assert any(c.batch_size * c.num_heads <= 2 for c in hidden)


def test_case_id_and_flops():
    c = parse_case_line("batch_size: 4; num_heads: 64; seq_len: 8192; head_dim: 128; seed: 1118", where="x:1")
    assert c.id == "b4_h64_s8192_d128"
    assert c.flops == 4 * 4 * 64 * 8192 ** 2 * 128
    assert Case.from_dict(c.to_dict()) == c


def test_comments_blank_lines_and_overrides(tmp_path):
    f = tmp_path / "c.txt"
    f.write_text("# header\n\nbatch_size: 1; num_heads: 2; seq_len: 3; head_dim: 64; seed: 5  # trailing\n"
                 "batch_size: 1; num_heads: 2; seq_len: 4; head_dim: 64; seed: 5; rtol: 0.02\n")
    cases = load_cases(f)
    assert [c.seq_len for c in cases] == [3, 4]
    assert cases[1].rtol == 0.02 and cases[0].rtol is None


@pytest.mark.parametrize("line, fragment", [
    ("batch_size: 1; num_heads: 64; seq_len: 1024; head_dim: 128", "missing seed"),
    ("batch_size: 1; num_heads: 64; seq_len: 10x; head_dim: 128; seed: 1", "seq_len must be a whole number; got '10x'"),
    ("batch_size: 1; num_heads: 64; seq_len: 0; head_dim: 128; seed: 1", "seq_len must be at least 1"),
    ("batch_size: 1; heads: 64; seq_len: 8; head_dim: 128; seed: 1", "unknown field 'heads'"),
    ("batch_size 1; num_heads: 64; seq_len: 8; head_dim: 128; seed: 1", "is not 'name: value'"),
    ("batch_size: 1; batch_size: 2; num_heads: 64; seq_len: 8; head_dim: 128; seed: 1", "given twice"),
    ("batch_size: 1; num_heads: 1; seq_len: 9; head_dim: 64; seed: 1; rtol: -0.01",
     "rtol must be a finite number >= 0 (the default is 1e-2); got -0.01"),
    ("batch_size: 1; num_heads: 1; seq_len: 9; head_dim: 64; seed: 1; atol: nan", "atol must be a finite number >= 0"),
    ("batch_size: 1; num_heads: 1; seq_len: 9; head_dim: 64; seed: 1; atol: 1e-2x", "atol must be a number; got '1e-2x'"),
    ("batch_size: 1; num_heads: 1; seq_len: 9; head_dim: 64; seed: -4", "seed must be a whole number from 0"),
    ("batch_size: -1; num_heads: 1; seq_len: 9; head_dim: 64; seed: 1", "batch_size must be at least 1; got -1"),
])
def test_malformed_line_names_file_line_and_fix(tmp_path, line, fragment):
    f = tmp_path / "cases.txt"
    f.write_text("# ok\nbatch_size: 1; num_heads: 1; seq_len: 8; head_dim: 64; seed: 1\n" + line + "\n")
    with pytest.raises(CaseFileError) as e:
        load_cases(f)
    assert f"{f}:3:" in str(e.value)
    assert fragment in str(e.value)


def test_duplicate_shape_and_empty_and_missing_file(tmp_path):
    f = tmp_path / "dup.txt"
    line = "batch_size: 1; num_heads: 1; seq_len: 8; head_dim: 64; seed: 1\n"
    f.write_text(line + line)
    with pytest.raises(CaseFileError, match=r"dup.txt:2: same shape as line 1"):
        load_cases(f)
    (tmp_path / "empty.txt").write_text("# nothing\n")
    with pytest.raises(CaseFileError, match="no test cases"):
        load_cases(tmp_path / "empty.txt")
    with pytest.raises(CaseFileError, match="cannot read"):
        load_cases(tmp_path / "absent.txt")


def test_all_cases_sorted_small_first_and_largest_is_public():
    cases = load_all_cases(config.PUBLIC_CASES, config.HIDDEN_CASES)
    assert [c.flops for c in cases] == sorted(c.flops for c in cases)
    assert any(c.hidden for c in cases)
    assert largest(cases).id == "b4_h64_s8192_d128"
    assert len(load_all_cases(config.PUBLIC_CASES, None)) == 3


def test_a_bom_is_accepted(tmp_path):
    f = tmp_path / "bom.txt"
    f.write_bytes(b"\xef\xbb\xbfbatch_size: 1; num_heads: 2; seq_len: 3; head_dim: 64; seed: 5\n")
    [case] = load_cases(f)
    assert case.batch_size == 1


def test_a_byte_that_is_not_utf8_names_the_line(tmp_path):
    f = tmp_path / "latin1.txt"
    f.write_bytes(b"# ok\n# caf\xe9\nbatch_size: 1; num_heads: 2; seq_len: 3; head_dim: 64; seed: 5\n")
    with pytest.raises(CaseFileError, match=r"latin1.txt:2: byte 0xe9 is not UTF-8"):
        load_cases(f)


def test_every_bad_line_is_reported_at_once(tmp_path):
    f = tmp_path / "c.txt"
    f.write_text("batch_size: 0; num_heads: 2; seq_len: 3; head_dim: 64; seed: 5\n"
                 "batch_size: 1; num_heads: 2; seq_len: 3; head_dim: 64; seed: 5\n"
                 "batch_size: 1; num_heads: 2; seq_len: 3; head_dim: 64; seed: 5; rtol: -1\n")
    with pytest.raises(CaseFileError) as e:
        load_cases(f)
    lines = str(e.value).splitlines()
    assert [line.split(": ", 1)[0] for line in lines] == [f"{f}:1", f"{f}:3"]

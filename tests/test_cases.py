import dataclasses
import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from grader.common import config
from grader.problem import (QK_STD_MAX, Case, CaseFileError, largest, load_all_cases, load_cases,
                          parse_case_line, with_cases)
from grader.problem import make_inputs

from .adversarial.assemble import assemble_one


def test_public_cases_are_the_three_cs149_shapes_the_smallest_drawn_wide():
    cases = load_cases(config.PUBLIC_CASES)
    assert [c.shape for c in cases] == [(1, 64, 1024, 128), (2, 64, 4096, 128), (4, 64, 8192, 128)]
    assert {c.seed for c in cases} == {1118}
    assert all(not c.hidden for c in cases)
    assert [c.qk_std for c in cases] == [6.0, 1.0, 1.0]
    assert [c.id for c in cases] == ["b1_h64_s1024_d128_qk6", "b2_h64_s4096_d128", "b4_h64_s8192_d128"]


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
    assert largest(cases).qk_std == 1.0   # the timed case: its calls draw fresh N(0, 1) inputs
    assert len(load_all_cases(config.PUBLIC_CASES, None)) == 3
    assert len(cases) == 9 and len(load_cases(config.CPU_CHECK_CASES)) == 4   # the points per case


# ---------------------------------------------------------------- wide inputs (issue 30, item 7)


def _max_abs_score(case: Case) -> float:
    """max |q·k| / sqrt(D) over the case's inputs (CPU draws), one (batch, head) at a time."""
    q, k, _ = make_inputs(case, "cpu")
    best = 0.0
    for b in range(case.batch_size):
        for h in range(case.num_heads):
            s = q[b, h].float() @ k[b, h].float().T / math.sqrt(case.head_dim)
            best = max(best, float(s.abs().max()))
    return best


@pytest.mark.parametrize("path, hidden", [(config.PUBLIC_CASES, False), (config.HIDDEN_CASES, True),
                                          (config.CPU_CHECK_CASES, False)])
def test_every_case_file_has_a_case_whose_scores_leave_exps_range(path, hidden):
    """Without the running maximum, exp of a score past 88.7 is inf in fp32, and so is exp2 of it
    times log2(e): every case file has a case whose scores pass 100 (the CPU draws here; the GPU
    draws others, from the same spread: 100 is under 3 of its standard deviations, 36, and each
    case has tens of thousands of scores or more). A hidden one is small enough to run on a CPU."""
    wide = [c for c in load_cases(path, hidden=hidden) if c.qk_std != 1.0]
    assert wide, f"{path}: no case with qk_std"
    for case in wide:
        top = _max_abs_score(case)
        assert top >= 100, (case.id, top)
        assert math.isinf(torch.exp(torch.tensor(top)).item())
        assert math.isinf(torch.exp2(torch.tensor(top * 1.4426950408889634)).item())
    if hidden or path == config.CPU_CHECK_CASES:   # graded (hidden) or checked (cpu.txt) on a CPU
        assert any(c.flops <= config.CPU_MAX_FLOPS for c in wide)
    # and N(0, 1) cases beside them, whose scores a softmax without its maximum survives even
    # in fp16 (exp overflows past 11.1): what such a kernel passes
    narrow = [c for c in load_cases(path, hidden=hidden) if c.qk_std == 1.0]
    assert narrow and all(_max_abs_score(c) < 11 for c in narrow if c.flops <= config.CPU_MAX_FLOPS)


def test_qk_std_is_parsed_named_in_the_id_and_kept():
    line = "batch_size: 3; num_heads: 5; seq_len: 113; head_dim: 128; seed: 13; qk_std: 6"
    c = parse_case_line(line, where="x:1")
    assert c.qk_std == 6.0 and c.id == "b3_h5_s113_d128_qk6"
    assert c.line() == line and parse_case_line(c.line(), where="x:1") == c
    assert Case.from_dict(json.loads(json.dumps(c.to_dict()))) == c   # the checker's spec, a Slurm task
    half = parse_case_line("batch_size: 1; num_heads: 1; seq_len: 9; head_dim: 64; seed: 1; qk_std: 2.5",
                           where="x:1")
    assert half.id == "b1_h1_s9_d64_qk2p5" and half.line().endswith("; qk_std: 2.5")
    assert Case(1, 1, 9, 64, seed=1, qk_std=2.5000001).id != half.id   # exact: never two spreads in one id
    default = parse_case_line("batch_size: 1; num_heads: 1; seq_len: 9; head_dim: 64; seed: 1; qk_std: 1",
                              where="x:1")
    assert default == Case(1, 1, 9, 64, seed=1) and default.id == "b1_h1_s9_d64"
    assert "qk_std" not in default.line()


@pytest.mark.parametrize("value, fragment", [
    ("0", "got 0."), ("-6", "got -6."), ("nan", "got nan."), ("inf", "got inf."),
    (f"{QK_STD_MAX + 0.5:g}", f"at most {QK_STD_MAX:g}"),
])
def test_a_bad_qk_std_names_file_line_and_fix(tmp_path, value, fragment):
    f = tmp_path / "cases.txt"
    f.write_text("batch_size: 1; num_heads: 1; seq_len: 8; head_dim: 64; seed: 1\n"
                 f"batch_size: 1; num_heads: 1; seq_len: 9; head_dim: 64; seed: 1; qk_std: {value}\n")
    with pytest.raises(CaseFileError) as e:
        load_cases(f)
    assert str(e.value).startswith(f"{f}:2: qk_std must be a number above 0 and at most 8 ")
    assert "the default is 1, and 6 puts the scores past exp's range" in str(e.value)
    assert fragment in str(e.value)
    f.write_text("batch_size: 1; num_heads: 1; seq_len: 9; head_dim: 64; seed: 1; qk_std: six\n")
    with pytest.raises(CaseFileError, match=rf"{f}:1: qk_std must be a number; got 'six'"):
        load_cases(f)


def test_the_same_shape_with_another_spread_is_another_case(tmp_path):
    f = tmp_path / "c.txt"
    base = "batch_size: 1; num_heads: 1; seq_len: 8; head_dim: 64; seed: 1"
    f.write_text(f"{base}\n{base}; qk_std: 6\n")
    assert [c.id for c in load_cases(f)] == ["b1_h1_s8_d64", "b1_h1_s8_d64_qk6"]
    f.write_text(f"{base}; qk_std: 6\n{base}; qk_std: 6.0\n")
    with pytest.raises(CaseFileError, match=r"c.txt:2: same shape and qk_std as line 1 \(b1_h1_s8_d64_qk6\)"):
        load_cases(f)
    f.write_text(base + "\n")
    public = load_cases(f)
    hidden = [dataclasses.replace(public[0], qk_std=6.0, hidden=True)]
    assert [c.id for c in with_cases(public, hidden)] == ["b1_h1_s8_d64", "b1_h1_s8_d64_qk6"]


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


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                    reason="this machine has no Triton wheel (the kit's set-up says so too)")
def test_the_grader_on_a_cpu_fails_a_softmax_without_its_running_max_on_the_wide_cases(tmp_path):
    """The real grader, on the CPU (Triton's interpreter), on test_cases/cpu.txt as the public
    cases and the course's hidden ones: the honest Triton kernel passes every case it can run;
    the same kernel without the running maximum (tests/adversarial/no_running_max_py) passes the
    N(0, 1) ones and gets mismatch, NaN, on each wide one, the CPU case and the hidden case."""
    subs = tmp_path / "subs"
    for name in ("honest_py", "no_running_max_py"):
        assemble_one(name, subs)
    out = tmp_path / "results"
    env = dict(os.environ, GRADER_SANDBOX="off", GRADER_RUN_S="240")
    proc = subprocess.run([sys.executable, "-m", "grader", "grade", str(subs), "--out", str(out),
                           "--build-dir", str(tmp_path / "build"), "--cases", str(config.CPU_CHECK_CASES),
                           "--cpu", "--no-solution", "--no-baselines", "--jobs", "1"],
                          capture_output=True, text=True, cwd=config.REPO_ROOT, env=env, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    honest, unsafe = (json.loads((out / f"{n}.json").read_text()) for n in ("honest_py", "no_running_max_py"))
    ran = {c["case"]: c for c in honest["cases"] if c["status"] != "not_run"}
    wide = {c.id for c in load_all_cases(config.CPU_CHECK_CASES, config.HIDDEN_CASES)
            if c.qk_std != 1.0 and c.flops <= config.CPU_MAX_FLOPS}
    assert wide == {"b1_h2_s200_d128_qk6", "b3_h5_s113_d128_qk6"} and wide <= set(ran)
    assert honest["status"] == "pass", honest["message"]
    assert all(c["status"] == "pass" for c in ran.values()), honest["cases"]
    for case in wide:   # the honest error on the wide cases, far inside the tolerance
        assert ran[case]["finding"]["max_abs_error"] < 0.005, ran[case]["finding"]
    assert unsafe["status"] == "mismatch"
    for c in (c for c in unsafe["cases"] if c["case"] in ran):
        if c["case"] in wide:
            assert c["status"] == "mismatch" and c["finding"]["nan_count"] + c["finding"]["inf_count"] > 0, c
        else:
            assert c["status"] == "pass", c

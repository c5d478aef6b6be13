"""The TileLang track (issue 15): the reach audit's rules for TileLang, its kernels' names in the
integrity check, and what a check without a GPU proves (compiled for the course GPU, not run)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

from grader.trusted.audit import allowlist

from grader.common import config

from grader.trusted import integrity
from grader.course.verdicts import CaseResult
from grader.report.hints import hint_for, progress_hint
from grader.common.status import Status
from grader.course.submission import read_sources

from .conftest import EXAMPLES, has_nvcc

TEMPLATE = config.REPO_ROOT / "student" / "tilelang"
EXAMPLE = EXAMPLES / "tilelang_flash"
HAS_TILELANG = importlib.util.find_spec("tilelang") is not None

HEAD = """
import torch
import tilelang
import tilelang.language as T
"""


def audit(body: str) -> list[str]:
    text = HEAD + textwrap.dedent(body)
    return [f.what for f in allowlist.audit_python({"submission.py": text}).flagged]


# ---------------------------------------------------------------- the reach audit


@pytest.mark.parametrize("folder", [TEMPLATE, EXAMPLE], ids=lambda p: p.parent.name)
def test_the_template_and_the_example_reach_nothing(folder):
    assert allowlist.audit_folder(read_sources(folder), folder) == allowlist.PythonAudit()


def test_the_jit_and_compile_api_is_allowed():
    assert audit("""
        @tilelang.jit(out_idx=[3])
        def k(n):
            @T.prim_func
            def main(A: T.Tensor((n,), "float16")):
                with T.Kernel(tilelang.cdiv(n, 64), threads=128) as bx:
                    T.clear(T.alloc_fragment((64,), "float32"))
            return main
        kernel = tilelang.compile(k.get_tir(128), out_idx=[3])
        """) == []


@pytest.mark.parametrize("body, flagged", [
    # raw source spliced into the module TileLang compiles and loads (host code included)
    ('T.import_source("__attribute__((constructor)) static void f() {}")', "import_source"),
    ('with T.Kernel(1, threads=128, prelude="static int x;") as bx:\n    pass', "prelude"),
    ('T.CUDASourceCodeKernel("...")', "CUDASourceCodeKernel"),
    ('tilelang.register_cuda_postproc(lambda code, target: code)', "tilelang.register_cuda_postproc"),
    # calls out of the host code: any C function, any TVM global function
    ('T.call_extern("int32", "dlopen", "libcudnn.so", 1)', "call_extern"),
    ('T.call_packed("runtime.ModuleLoadFromFile", "x.so")', "call_packed"),
    ('T.tvm_call_packed("x")', "tvm_call_packed"),
    ('T.evaluate(T.Call("int32", "tir.call_extern", ["system"]))', "Call"),
    ('op = "tir." + "call_" + "ext" + "ern"', "'tir.'"),
    ('T.tir.call_extern("int32", "system", "sh")', "tilelang.language.tir"),
    # the compiler's command line and targets that hand the work elsewhere
    ('tilelang.jit(out_idx=[3], compile_flags=["-ccbin", "/tmp/x"])', "compile_flags"),
    ('tilelang.jit(out_idx=[3], target="llvm")', "target="),
    ('tilelang.jit(out_idx=[3], execution_backend="torch")', "execution_backend"),
    ('tilelang.jit(out_idx=[3], pass_configs={})', "pass_configs"),
    ('opts = {"out_idx": [3]}\ntilelang.jit(**opts)', "**"),
    ('opts = {"compile_flags": ["-ccbin=/tmp/x"]}', "'compile_flags'"),
    # TileLang's own library, its TVM and its internals
    ('tilelang.carver.arch.CUDA("cuda")', "tilelang.carver"),
    ('tilelang.tvm.get_global_func("x")', "tilelang.tvm"),
    ('tilelang.contrib.nvcc.compile_cuda("", "ptx")', "tilelang.contrib"),
    ('tilelang.engine.lower(None)', "tilelang.engine"),
    ('tilelang.env.TILELANG_CACHE_DIR', "tilelang.env"),
    ('from tilelang import tvm', "tilelang.tvm"),
    ('import tilelang.autotuner', "tilelang.autotuner"),
    ('from tilelang.jit.kernel import JITKernel', "tilelang.jit.kernel"),
    ('import tilelang.jit.adapter', "tilelang.jit.adapter"),
    ('from tilelang.language import tir', "tilelang.language.tir"),
    ('from tilelang import compile\ncompile(None)', "compile"),
    # red team, session 7 (tests/adversarial/tilelang_flags_py, tilelang_annotate_py): the
    # compiler's options by position, the compiler as a value, names built on the listed ones
    ('tilelang.compile(f, None, "cython", "c", None, None, None, ["-include", "/tmp/h.h"])',
     "tilelang.compile(...)"),
    ('args = [None, "cython", "c"]\ntilelang.compile(f, *args)', "tilelang.compile(...)"),
    ('build = tilelang.compile\nbuild(f, None, "cython")', "tilelang.compile"),
    ('import functools\nfunctools.partial(tilelang.jit, out_idx=[3])', "tilelang.jit"),
    ('T.annotate_compile_flags(["-include", "/tmp/h.h"])', "annotate_compile_flags"),
    ('T.annotate_pass_configs({})', "annotate_pass_configs"),
    ('T.anylist_setitem_call_packed(x, 0, 1)', "anylist_setitem_call_packed"),
])
def test_ways_past_the_kernel_are_flagged(body, flagged):
    assert flagged in audit(body)


def test_a_docstring_may_speak_of_intrinsics():
    assert audit('"""Tensor-core intrinsics, no extern calls: tir.call_extern is not used."""') == []


def test_the_rules_hold_in_every_file_of_a_tilelang_submission():
    files = {"submission.py": HEAD + "import helper\n",
             "helper.py": "def f(T):\n    return T.call_extern('int32', 'system', 'sh')\n"}
    assert "call_extern" in [f.what for f in allowlist.audit_python(files).flagged]
    # a Triton or plain submission keeps its own names: `target` is no way in there
    assert allowlist.audit_python({"submission.py": "def f(x, target=None):\n    return x\n"}) \
        == allowlist.PythonAudit()


def test_a_library_attention_in_a_tilelang_submission_is_flagged_by_what_ran():
    """The audit does not forbid calling torch (no Python submission is stopped from naming
    SDPA); what ran decides: cuDNN's and flash-attention's kernels are a library's, whatever the
    submission's own kernels are called."""
    source = HEAD + textwrap.dedent("""
        @T.prim_func
        def attention(Q: T.Tensor((1,), "float16")):
            pass

        def custom_kernel(data):
            return torch.nn.functional.scaled_dot_product_attention(*data)
        """)
    own = integrity.own_kernel_names(source)
    launched = [("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1"
                 "_kernel0_0", 1),
                ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, "
                 "false, cutlass::half_t>, false, false>(Flash_fwd_params)", 1),
                ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, float>(float*)", 1),
                ("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_TNN", 1)]
    flags = integrity.classify_launched(launched, own, gpu=True)
    assert [f.reason for f in flags] == ["library"] * 4
    assert integrity.static_evidence(source)


# ---------------------------------------------------------------- whose kernels ran


def test_tilelang_kernels_are_named_after_their_prim_func():
    for folder in (TEMPLATE, EXAMPLE):
        own = integrity.own_kernel_names(read_sources(folder))
        assert "attention_kernel" in own
        # as the profiler reports it: TileLang's kernels are extern "C", so their names are bare
        assert integrity.classify_launched([("attention_kernel", 7)], own, gpu=True) == []
    source = ("import tilelang.language as T\n@T.prim_func\ndef main(A):\n    pass\n"
              "f = T.prim_func(body)\n")
    assert {"main_kernel", "body_kernel"} <= integrity.own_kernel_names(source)


def test_a_kernel_that_is_not_a_prim_func_of_the_source_is_not_its_own():
    own = integrity.own_kernel_names((EXAMPLE / "submission.py").read_text())
    flags = integrity.classify_launched([("main_kernel", 1), ("flash_forward_kernel", 1),
                                         ("custom_kernel_kernel", 1)], own, gpu=True)
    assert [f.reason for f in flags] == ["not in the source"] * 3


def test_a_prim_func_named_like_a_library_kernel_is_still_a_library_kernel():
    own = integrity.own_kernel_names("import tilelang.language as T\n"
                                     "@T.prim_func\ndef cudnn_sdpa(A):\n    pass\n"
                                     "@T.prim_func\ndef flash_fwd(A):\n    pass\n")
    flags = integrity.classify_launched([("cudnn_sdpa_kernel", 1),
                                         ("void flash::flash_fwd_kernel<Traits>(Params)", 1)],
                                        own, gpu=True)
    assert [f.reason for f in flags] == ["library", "library"]


# ---------------------------------------------------------------- without a GPU


def test_the_hint_says_what_compiling_without_a_gpu_proved():
    message = ("not run: TileLang lowered attention_kernel to CUDA and nvcc compiled it for sm_90a; "
               "there is no GPU here to launch it, so nothing about its results is known")
    cases = [CaseResult(f"c{i}", Status.NOT_RUN, message) for i in range(4)] + \
        [CaseResult("big", Status.NOT_RUN, "not run: too large for the CPU (no CUDA device)")]
    skeleton = (TEMPLATE / "submission.py").read_text()
    hint = hint_for(None, cases, skeleton)
    assert hint.startswith("TileLang lowered your kernel to CUDA and nvcc compiled it for sm_90a on "
                           "4 small cases; none of them ran (TileLang has no CPU interpreter), so "
                           "whether it is right, or fast, needs a GPU.")
    assert "TODO(1.1): the online softmax's state" in hint
    assert progress_hint((EXAMPLE / "submission.py").read_text()).startswith("No TODO of stage 1")


def check(folder, tmp_path, cases: str, **env) -> tuple[subprocess.CompletedProcess, dict]:
    cases_file = tmp_path / "cases.txt"
    cases_file.write_text(cases)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "grader", "check", str(folder), "--out", str(out),
                           "--cases", str(cases_file), "--no-hidden", "--cpu",
                           "--build-dir", str(tmp_path / "build")],
                          capture_output=True, text=True, cwd=config.REPO_ROOT, timeout=900,
                          env=dict(os.environ, HOME=str(tmp_path), **env))
    return proc, json.loads((out / f"{folder.name}.json").read_text())


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TILELANG or not has_nvcc(), reason="needs TileLang and nvcc")
def test_without_a_gpu_the_example_is_compiled_for_the_course_gpu_and_not_run(tmp_path):
    proc, result = check(EXAMPLE, tmp_path, "batch_size: 1; num_heads: 2; seq_len: 77; "
                                            "head_dim: 64; seed: 3\n")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert result["status"] == "not_run" and "tilelang_flash: NOT_RUN" in proc.stdout
    assert ("TileLang lowered attention_kernel to CUDA and nvcc compiled it for "
            f"sm_{config.DEFAULT_CUDA_ARCH}") in result["cases"][0]["message"]
    # issue 34: it says nothing ran, and no note claims a case ran on the CPU
    assert proc.stdout.startswith("tilelang_flash: NOT_RUN (nothing ran: no CUDA device)\n")
    assert "ran on the CPU" not in proc.stdout and not any("ran on" in n for n in result["notes"])
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TILELANG or not has_nvcc(), reason="needs TileLang and nvcc")
def test_without_a_gpu_a_kernel_tilelang_cannot_compile_is_a_runtime_error(tmp_path):
    """A kernel that does not lower never gets the 'compiled' message: its case fails with
    TileLang's error, as it would on the GPU."""
    folder = tmp_path / "broken"
    folder.mkdir()
    text = (EXAMPLE / "submission.py").read_text()
    broken = text.replace("T.reduce_sum(scores, row_sum, dim=1)", "T.reduce_sum(scores, row_sum, dim=3)")
    assert broken != text
    (folder / "submission.py").write_text(broken)
    proc, result = check(folder, tmp_path, "batch_size: 1; num_heads: 1; seq_len: 5; "
                                           "head_dim: 64; seed: 3\n")
    assert result["status"] == "runtime_error", result["message"]
    assert "TileLang lowered" not in proc.stdout and "compiled it for" not in json.dumps(result)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TILELANG, reason="needs TileLang")
def test_without_nvcc_nothing_is_claimed(tmp_path):
    """A machine whose TileLang finds no nvcc compiles nothing: the case says so, and the kernel
    gets no verdict (never a runtime_error for the machine's lack, never 'compiled')."""
    proc, result = check(EXAMPLE, tmp_path, "batch_size: 1; num_heads: 1; seq_len: 5; "
                                            "head_dim: 64; seed: 3\n", CUDA_HOME=str(tmp_path / "no-cuda"))
    assert result["status"] == "not_run", result["message"]
    assert "not compiled, not run: TileLang compiles with nvcc, which this machine lacks" \
        in result["cases"][0]["message"]
    assert "TileLang lowered" not in json.dumps(result)

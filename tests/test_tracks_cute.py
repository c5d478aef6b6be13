"""The CuTe track (issue 15): CUTLASS/CuTe headers on every CUDA build's include path, a build
key that follows CUTLASS's version, the rule for whose kernel a CuTe kernel is, and the example's
tiling math."""

from __future__ import annotations

import dataclasses
import math
import os
import sys

import numpy as np
import pytest

from grader.build import stage as build
from grader.build import child as build_child, flags as build_flags, log as build_log

from grader.trusted.audit import object_file, reach

from grader.isolation import sandbox
from grader.build.cache import BuildCache
from grader.isolation.device import DeviceInfo
from grader.trusted.integrity import classify_launched, own_kernel_names
from grader.course.submission import inspect_folder

from .conftest import EXAMPLES
from .test_reach import compile_object, needs_gxx

CPU = DeviceInfo(cuda=False, name="cpu", capability=None, arch="90a", l2_bytes=0, memory_bytes=0,
                 sm_count=0, driver="none", torch_version="2.13.0+cpu", cuda_version=None,
                 nvcc=sys.executable, python="3.11.7")
GPU = dataclasses.replace(CPU, cuda=True, name="gpu", capability=(9, 0), cuda_version="13.0")


# ---------------------------------------------------------------- headers and the build key


def test_the_set_up_installs_cutlass_and_its_headers_are_found():
    folder = build_flags.cutlass_include()
    assert folder, "nvidia-cutlass is not installed: scripts/bootstrap.sh installs it"
    assert os.path.isfile(os.path.join(folder, "cute", "tensor.hpp"))
    assert os.path.isfile(os.path.join(folder, "cutlass", "numeric_types.h"))
    identity = build_flags.cutlass_identity()
    assert identity["headers"].count(".") == 2 and identity["dist"].startswith(identity["headers"])


def test_the_cutlass_headers_are_on_the_compile_checks_and_the_extensions_include_path(
        tmp_path, monkeypatch):
    folder = build_flags.cutlass_include()
    cmd = build_child.compile_check_command(tmp_path / "cuda.cu", tmp_path / "cuda.cuda.o", "m", "90a",
                                            "nvcc")
    assert any(cmd[i] == "-I" and cmd[i + 1] == folder for i in range(len(cmd) - 1)), cmd
    from torch.utils import cpp_extension
    seen = {}
    monkeypatch.setattr(cpp_extension, "load_inline", lambda **kw: seen.update(kw))
    # build_extension replaces this (it builds without importing): restored after the test
    monkeypatch.setattr(cpp_extension, "_import_module_from_library",
                        cpp_extension._import_module_from_library)
    (tmp_path / "submission.cu").write_text("// a kernel\n")
    build_child.build_extension(tmp_path / "submission.cu", "m", tmp_path / "b", "90a")
    assert seen["extra_include_paths"] == [folder]


def test_the_sandbox_lets_a_build_read_the_cutlass_headers():
    folder = os.path.realpath(build_flags.cutlass_include())
    readable = sandbox.default_layout()["readable"]
    assert any(folder == r or folder.startswith(os.path.realpath(r) + os.sep) for r in readable)


def test_without_the_wheel_plain_cuda_builds_and_a_cute_build_names_what_to_install(
        tmp_path, monkeypatch):
    monkeypatch.setattr(build_flags, "cutlass_include", lambda: None)
    monkeypatch.setattr(build_log, "cutlass_include", lambda: None)
    cmd = build_child.compile_check_command(tmp_path / "cuda.cu", tmp_path / "cuda.cuda.o", "m", "90a",
                                            "nvcc")
    assert not [c for c in cmd if "cutlass" in c]
    for out in ("cuda.cu:20:10: fatal error: cute/tensor.hpp: No such file or directory",
                'cuda.cu(20): catastrophic error: cannot open source file "cutlass/numeric_types.h"'):
        problem = build.environment_problem(out, "compile_only")
        assert "nvidia-cutlass" in problem and "bootstrap.sh" in problem, out
    # with the headers installed, a misspelt CuTe header is the student's own build error
    monkeypatch.setattr(build_flags, "cutlass_include", lambda: "/somewhere")
    monkeypatch.setattr(build_log, "cutlass_include", lambda: "/somewhere")
    assert build.environment_problem("fatal error: cute/tensorr.hpp: No such file or directory",
                                     "compile_only") == ""


def test_the_build_key_changes_with_the_cutlass_version(tmp_path, monkeypatch):
    (tmp_path / "alice").mkdir()
    (tmp_path / "alice" / "submission.cu").write_text("#include <cute/tensor.hpp>\n")
    alice = inspect_folder(tmp_path / "alice")
    real = build_flags.cutlass_identity()
    for device in (CPU, GPU):
        key = lambda: BuildCache.key(build.build_inputs(alice, device))
        base = key()
        monkeypatch.setattr("grader.build.inputs.cutlass_identity",
                            lambda: {**real, "dist": "4.3.0.0", "headers": "4.3.0"})
        assert key() != base
        monkeypatch.setattr("grader.build.inputs.cutlass_identity", lambda: {**real, "digest": "edited"})
        assert key() != base
        monkeypatch.setattr("grader.build.inputs.cutlass_identity", lambda: None)   # uninstalled
        assert key() != base
        monkeypatch.setattr("grader.build.inputs.cutlass_identity", lambda: real)
        assert key() == base


# ---------------------------------------------------------------- whose kernel it is

# Names as the profiler reports them: demangled, with template arguments and parameters.
TILED_MMA = ("cute::TiledMMA<cute::MMA_Atom<cute::SM80_16x8x16_F32F16F16F32_TN>, "
             "cute::Layout<cute::tuple<cute::C<4>, cute::C<1>, cute::C<1> >, "
             "cute::tuple<cute::C<1>, cute::C<0>, cute::C<0> > >, "
             "cute::tuple<cute::C<64>, cute::C<16>, cute::C<16> > >")
CUTE_KERNEL = (f"void attention_kernel1<{TILED_MMA}, 128>(cute::Tensor<cute::ViewEngine<"
               f"cute::gmem_ptr<cutlass::half_t const*> >, cute::Layout<cute::tuple<int, "
               f"cute::C<128> >, cute::tuple<cute::C<128>, cute::C<1> > > >, int, float)")
EXAMPLE_KERNEL = ("void attention_kernel1<64>(cutlass::half_t const*, cutlass::half_t const*, "
                  "cutlass::half_t const*, cutlass::half_t*, int, float)")
GEMM_UNIVERSAL = ("cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, int, int>, "
                  "cutlass::gemm::collective::CollectiveMma<cutlass::gemm::MainloopSm90TmaGmmaWarpSpecialized"
                  "<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, "
                  "cutlass::gemm::KernelTmaWarpSpecialized>, cute::tuple<cute::C<128>, cute::C<128>, "
                  "cute::C<64> >, cutlass::half_t>, cutlass::epilogue::collective::DefaultEpilogue"
                  "<float>, void, void>")
DEVICE_KERNEL = f"void cutlass::device_kernel<{GEMM_UNIVERSAL}>({GEMM_UNIVERSAL}::Params)"
LEGACY_KERNEL = ("void cutlass::Kernel2<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::"
                 "threadblock::MmaMultistage<cutlass::gemm::GemmShape<128, 128, 32> > > >"
                 "(cutlass::gemm::kernel::GemmUniversal<>::Params)")
WRAPPED = f"void attention_kernel2<{GEMM_UNIVERSAL}>({GEMM_UNIVERSAL}::Params)"

CUTE_SOURCE = """
template <class TiledMma, int D>
__global__ void __launch_bounds__(decltype(size(TiledMma{}))::value)
attention_kernel1(cute::Tensor<Engine, Layout> Q, int S, float softmax_scale) { }

template <class Gemm>
CUTLASS_GLOBAL void attention_kernel2(typename Gemm::Params params) { Gemm{}(params); }
"""


def test_the_names_a_cute_source_defines_are_found():
    assert own_kernel_names(CUTE_SOURCE) == {"attention_kernel1", "attention_kernel2"}
    example = (EXAMPLES / "cute_flash" / "submission.cu").read_text()
    assert "attention_kernel1" in own_kernel_names(example)


def test_a_kernel_instantiating_cute_templates_is_the_students_own():
    own = own_kernel_names(CUTE_SOURCE)
    assert classify_launched([(CUTE_KERNEL, 10), (EXAMPLE_KERNEL, 10)],
                             own | {"attention_kernel1"}, gpu=True) == []


@pytest.mark.parametrize("name", [DEVICE_KERNEL, LEGACY_KERNEL, WRAPPED],
                         ids=["device_kernel", "Kernel2", "own_name_wrapping_GemmUniversal"])
def test_a_cutlass_library_kernel_is_never_the_students_own(name):
    """CUTLASS's device-level API launches cutlass::device_kernel<...> (or Kernel2 in 2.x): a
    library namespace. A __global__ of the student's whose template arguments are a CUTLASS
    kernel is the same kernel under another name. Both are flagged, even though the source
    defines a kernel called attention_kernel2 and mentions device_kernel."""
    own = own_kernel_names(CUTE_SOURCE) | {"device_kernel", "Kernel2"}
    flags = classify_launched([(name, 3)], own, gpu=True)
    assert [f.name for f in flags] == [name] and flags[0].reason.startswith("library")


@needs_gxx
def test_the_host_stub_nvcc_gives_a_device_function_passes_the_reach_audit(tmp_path):
    """nvcc gives every non-inline __device__ function a host stub that calls exit(1): an honest
    CuTe (or plain CUDA) kernel's helper must not be flagged for it."""
    obj = compile_object(tmp_path, """
        #include <cstdlib>
        float quad_sum(float x) { std::exit(1); }""")
    assert reach.native_reach(obj) == []


# ---------------------------------------------------------------- the example's tiling, modelled


def tiled_attention(q, k, v, Br=64, Bc=64):
    """examples/cute_flash's loop in numpy, one (batch, head): (S, D) fp16 inputs, tiles of
    Br query rows and Bc keys (zero-filled past S), raw-score running max m_i, exp2 with
    softmax_scale * log2(e), keys past S at -inf, P rounded to fp16 before P·V (the MMA's A
    operand), l_i summed from four quarter-shares (a quad's threads), O = acc / l_i in fp16."""
    S, D = q.shape
    scale_log2 = np.float32(1 / math.sqrt(D) * 1.4426950408889634)
    out = np.zeros((S, D), np.float16)
    pad = lambda x, rows: np.concatenate([x, np.zeros((rows - x.shape[0], D), x.dtype)])
    for m0 in range(0, S, Br):
        q_tile = pad(q[m0:m0 + Br], Br).astype(np.float32)
        m_i = np.full(Br, -np.inf, np.float32)
        l_parts = np.zeros((Br, 4), np.float32)
        acc = np.zeros((Br, D), np.float32)
        for n0 in range(0, S, Bc):
            kv_rows = S - n0
            k_tile = pad(k[n0:n0 + Bc], Bc).astype(np.float32)
            v_tile = pad(v[n0:n0 + Bc], Bc).astype(np.float32)
            s = q_tile @ k_tile.T
            if kv_rows < Bc:
                s[:, kv_rows:] = -np.inf
            m_new = np.maximum(m_i, s.max(axis=1))
            assert np.isfinite(m_new).all()      # every tile has a valid key
            rescale = np.exp2((m_i - m_new) * scale_log2)
            m_i = m_new
            p = np.exp2(s * scale_log2 - (m_new * scale_log2)[:, None])
            # each of a quad's 4 threads holds columns 2t, 2t+1 of every 8
            quarter = (np.arange(Bc) // 2) % 4
            l_parts = l_parts * rescale[:, None] + np.stack(
                [p[:, quarter == t].sum(axis=1) for t in range(4)], axis=1)
            acc = acc * rescale[:, None] + p.astype(np.float16).astype(np.float32) @ v_tile
        rows = min(Br, S - m0)
        out[m0:m0 + rows] = (acc / l_parts.sum(axis=1)[:, None])[:rows].astype(np.float16)
    return out


@pytest.mark.parametrize("S", [1, 63, 64, 65, 77, 113, 200])
@pytest.mark.parametrize("D", [64, 128])
def test_the_examples_tiling_math_is_softmax_attention(S, D):
    rng = np.random.default_rng(S * 1000 + D)
    q, k, v = (rng.standard_normal((S, D)).astype(np.float16) for _ in range(3))
    scores = q.astype(np.float64) @ k.astype(np.float64).T / math.sqrt(D)
    p = np.exp(scores - scores.max(axis=1, keepdims=True))
    expected = (p / p.sum(axis=1, keepdims=True)) @ v.astype(np.float64)
    got = tiled_attention(q, k, v).astype(np.float64)
    assert np.abs(got - expected).max() <= 1e-2 + 1e-2 * np.abs(expected).max()   # config's tolerance


def test_the_hint_follows_the_cute_template_not_the_cuda_skeleton():
    from grader.report import hints
    template = (build.config.REPO_ROOT / "student" / "cute" / "submission.cu").read_text()
    assert hints.progress_hint(template).startswith(
        "The first TODO still on the skeleton's code is TODO(1.1): the mask.")
    example = (EXAMPLES / "cute_flash" / "submission.cu").read_text()
    assert hints.progress_hint(example).startswith("No TODO of stage 1 is still on the skeleton's code")


KERNELS = """
    namespace cutlass { namespace gemm { namespace kernel {
      struct GemmUniversal { struct Params { int m; }; }; } }
      template <class Kernel> void device_kernel(typename Kernel::Params) {} }
    namespace cute { template <int M, int N> struct TiledMMA {}; }
    template <class Kernel> void attention_kernel2(typename Kernel::Params) {}
    template <class Mma, int D> void attention_kernel1(float*) {}
    template void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal>(
        cutlass::gemm::kernel::GemmUniversal::Params);
    template void attention_kernel2<cutlass::gemm::kernel::GemmUniversal>(
        cutlass::gemm::kernel::GemmUniversal::Params);
    template void attention_kernel1<cute::TiledMMA<64, 16>, 128>(float*);
    void helper_not_a_kernel(cutlass::gemm::kernel::GemmUniversal::Params) {}
"""


@needs_gxx
def test_the_reach_audit_names_a_cutlass_kernel_compiled_into_the_object(tmp_path):
    """Shaped as nvcc leaves a kernel in the host object: a host stub under the kernel's own
    mangled name and a `__device_stub__` function that repeats it (length-prefixed)."""
    import subprocess
    plain = compile_object(tmp_path, KERNELS)
    mangled = [s for s in subprocess.run(["nm", "--defined-only", "--format=just-symbols", str(plain)],
                                         capture_output=True, text=True).stdout.split()
               if s.startswith("_Z") and "helper" not in s]
    assert len(mangled) == 3
    stubs = "".join(f"\nvoid __device_stub__{m[1:]}() {{}}" for m in mangled)   # as nvcc names it
    obj = compile_object(tmp_path, KERNELS + stubs)
    kernels = object_file.defined_kernels(obj)
    assert sorted(k.split("<")[0] for k in kernels) == \
        ["void attention_kernel1", "void attention_kernel2", "void cutlass::device_kernel"]
    flagged = {f.what.split("<")[0] for f in reach.library_kernels(obj)}
    assert flagged == {"void attention_kernel2", "void cutlass::device_kernel"}
    assert [f for f in reach.native_reach(obj) if "library's kernel" in f.why]

"""Reach audit (grader/trusted/audit/reach.py): what a CUDA submission's build could get at, read before it runs,
and the subject's loader (sources only)."""

from __future__ import annotations

import importlib
import py_compile
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from grader.common import config

from grader.trusted.audit import object_file, reach
from grader.course.submission import read_sources

from .conftest import EXAMPLES, has_nvcc

REPO = Path(__file__).resolve().parents[1]


# The Python audit's tests are in tests/test_allowlist.py.


# ---------------------------------------------------------------- the loader: sources only


def test_the_subject_imports_the_audited_source_never_a_shipped_cache(tmp_path):
    """A bytecode cache that claims to be valid for helper.py (unchecked hash) holds other code;
    an ordinary import runs it, the subject's loader compiles the source."""
    folder = tmp_path / "sub"
    folder.mkdir()
    (folder / "helper.py").write_text("WHO = 'source'\n")
    other = tmp_path / "other.py"
    other.write_text("WHO = 'planted'\n")
    cache = importlib.util.cache_from_source(str(folder / "helper.py"))
    Path(cache).parent.mkdir()
    py_compile.compile(str(other), cfile=cache,
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    (folder / "planted.pyc").write_bytes(Path(cache).read_bytes())   # sourceless module
    probe = textwrap.dedent(f"""
        import sys
        folder = {str(folder)!r}
        if sys.argv[1] == "subject":
            from pathlib import Path
            from grader.subject.load import source_only_imports
            source_only_imports(Path(folder).resolve())
        sys.path.insert(0, folder)
        import helper
        print(helper.WHO)
        try:
            import planted
            print("planted importable")
        except ImportError:
            print("planted refused")
        """)
    def run(mode):
        return subprocess.run([sys.executable, "-c", probe, mode], capture_output=True, text=True,
                              cwd=REPO, timeout=300, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    plain = run("plain").stdout.split()
    assert plain == ["planted", "planted", "importable"]          # the attack works without it
    guarded = run("subject")
    assert guarded.stdout.split() == ["source", "planted", "refused"], guarded.stderr[-2000:]


# ---------------------------------------------------------------- native: the object's imports

needs_gxx = pytest.mark.skipif(any(shutil.which(t) is None for t in ("g++", "nm", "objdump")),
                               reason="needs g++ and binutils")


def compile_object(tmp_path, source: str, *flags: str) -> Path:
    """An object file as a build leaves it: beside it, the record of the headers its compile
    opened (build.HEADERS_RECORD, from g++'s dependency list as from nvcc's)."""
    from grader.build import headers as build_headers
    src, obj = tmp_path / "cuda.cu.cpp", tmp_path / "cuda.cuda.o"
    src.write_text(textwrap.dedent(source))
    subprocess.run(["g++", "-c", "-fPIC", "-O1", "-MD", "-MF", str(tmp_path / build_headers.DEPFILE),
                    *flags, "-o", str(obj), str(src)], check=True, timeout=300)
    build_headers.record_headers(tmp_path, build_headers._depfile_headers(tmp_path / build_headers.DEPFILE),
                                 how="g++ -MD", base=tmp_path)
    return obj


# Declarations shaped like the ones torch's headers give (same mangled names), without torch.
DECLARATIONS = """
    #include <cstring>
    #include <cstdio>
    namespace at { namespace _ops {
      struct empty_memory_format { static int call(int); };
      struct transpose_int { static int call(int); };
      struct to_dtype_layout { static int call(int); };
      struct matmul { static int call(int); };
      struct _softmax { static int call(int); };
      struct _scaled_dot_product_cudnn_attention { static int call(int); };
    } }
    namespace at { namespace cuda { int mm(int); int warp_size(); }
                   namespace compositeimplicitautograd { int matmul(int); }
                   struct DynamicLibrary { DynamicLibrary(const char*); void* sym(const char*); }; }
    extern "C" {
      int __cudaLaunchKernel(const void*, int);
      struct _object; typedef struct _object PyObject;
      PyObject* PyImport_AddModule(const char*);
      int PyObject_SetAttrString(PyObject*, const char*, PyObject*);
      void* dlsym(void*, const char*);
      int cuGetProcAddress(const char*, void**, int, unsigned long long);
      void* _IO_popen(const char*, const char*);
      int _Fork(void);
    }
"""


@needs_gxx
def test_an_honest_objects_imports_pass(tmp_path):
    obj = compile_object(tmp_path, DECLARATIONS + """
        int forward(int x, char* a, const char* b) {
            std::memcpy(a, b, 4);
            return at::_ops::empty_memory_format::call(x) + at::_ops::transpose_int::call(x)
                 + at::_ops::to_dtype_layout::call(x) + __cudaLaunchKernel(nullptr, x)
                 + at::cuda::warp_size();
        }""")
    assert reach.native_reach(obj) == []


@needs_gxx
def test_an_objects_ways_in_are_named(tmp_path):
    obj = compile_object(tmp_path, DECLARATIONS + """
        int forward(int x) {
            PyObject_SetAttrString(PyImport_AddModule("__main__"), "launched_names", nullptr);
            void* f = dlsym(nullptr, "x");
            cuGetProcAddress("cuLaunchKernel", &f, 12000, 0);
            std::FILE* maps = std::fopen("/proc/self/maps", "r");
            at::DynamicLibrary lib("libpython3.so");
            long pid;
            asm volatile("syscall" : "=a"(pid) : "a"(39L) : "rcx", "r11", "memory");
            return at::_ops::matmul::call(x) + at::_ops::_softmax::call(x)
                 + at::_ops::_scaled_dot_product_cudnn_attention::call(x) + (maps != nullptr)
                 + at::cuda::mm(x) + at::compositeimplicitautograd::matmul(x) + _Fork()
                 + (_IO_popen("sh", "r") != nullptr) + (lib.sym("x") != nullptr) + (int)pid;
        }""")
    named = {f.what: f.why for f in reach.native_reach(obj)}
    for what in ("PyImport_AddModule", "PyObject_SetAttrString", "dlsym", "cuGetProcAddress",
                 "fopen", "at::_ops::matmul::call", "at::_ops::_softmax::call",
                 "at::_ops::_scaled_dot_product_cudnn_attention::call", "at::cuda::mm",
                 "at::compositeimplicitautograd::matmul", "at::DynamicLibrary::sym", "_Fork",
                 "_IO_popen", "syscall instruction"):
        assert what in named, (what, named)
    assert "Python C API" in named["PyImport_AddModule"]
    assert "computes" in named["at::_ops::matmul::call"]


@needs_gxx
def test_the_driver_gives_tensor_map_encoding_and_nothing_else(tmp_path):
    """The grader links the CUDA driver into every extension (build.driver_ldflags) so that a
    kernel's host code can encode TMA tensor maps; every other driver call is still a way out."""
    obj = compile_object(tmp_path, """
        extern "C" {
          int cuTensorMapEncodeTiled(void*, int, unsigned, void*, const void*, const void*,
                                     const void*, const void*, int, int, int, int);
          int cuGetErrorString(int, const char**);
          int cuTensorMapReplaceAddress(void*, void*);
          int cuModuleLoadData(void**, const void*);
          int cuLaunchKernel(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, void*, void**, void**);
          int cuMemcpyDtoH_v2(void*, unsigned long long, unsigned long);
          int cuCtxCreate_v2(void**, unsigned, int);
        }
        int forward(void* map, void* base) {
            const char* s;
            return cuTensorMapEncodeTiled(map, 6, 3, base, 0, 0, 0, 0, 0, 3, 2, 0)
                 + cuGetErrorString(0, &s) + cuTensorMapReplaceAddress(map, base)
                 + cuModuleLoadData(&map, base) + cuMemcpyDtoH_v2(base, 0, 4)
                 + cuLaunchKernel(map, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0) + cuCtxCreate_v2(&map, 0, 0);
        }""")
    named = {f.what for f in reach.native_reach(obj)}
    assert named == {"cuTensorMapReplaceAddress", "cuModuleLoadData", "cuLaunchKernel",
                     "cuMemcpyDtoH_v2", "cuCtxCreate_v2"}, named


@pytest.mark.skipif(not has_nvcc(), reason="needs nvcc")
def test_the_reference_solution_passes_the_reach_audit(tmp_path):
    """The solution is compiled as every submission is (the compile check's translation unit and
    flags) and its object's imports audited: a kernel that reaches the driver through an
    entry-point lookup would rank the reference row 'flagged' on the GPU (session 8, kernel 6)."""
    from grader.isolation.device import find_nvcc
    proc = subprocess.run([sys.executable, "-m", "grader.build.stage", "compile_only",
                           str(REPO / "solution" / "submission.cu"), "--name", "solution_audit",
                           "--build-dir", str(tmp_path), "--arch", config.DEFAULT_CUDA_ARCH,
                           "--nvcc", find_nvcc()], cwd=REPO, capture_output=True, text=True,
                          timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [f.describe() for f in reach.native_reach(tmp_path / "cuda.cuda.o")] == []
    # nothing for an instructor to review, and its kernels (in an anonymous namespace) are its own
    assert reach.native_review(tmp_path, read_sources(REPO / "solution")) == ([], [])
    from grader.trusted.integrity import cpp_kernel_names
    assert {"attention_kernel3", "attention_kernel5", "attention_kernel6"} <= \
        cpp_kernel_names(tmp_path / "cuda.cuda.o")


def test_without_nm_the_audit_says_what_the_machine_lacks(monkeypatch, tmp_path):
    monkeypatch.setattr(object_file.shutil, "which", lambda name: None)
    with pytest.raises(reach.AuditUnavailable, match="binutils"):
        reach.native_reach(tmp_path / "cuda.cuda.o")


def test_an_unauditable_build_is_the_machines_fault(monkeypatch, tmp_path):
    from grader.course.verdicts import BuildResult
    from grader.stages.judge import audit_build
    from grader.common.status import Status
    from grader.course.submission import inspect_folder
    sub = inspect_folder(EXAMPLES / "naive_cuda")
    monkeypatch.setattr(object_file.shutil, "which", lambda name: None)
    r = audit_build(sub, BuildResult(Status.PASS, "extension", 1.0, artifact="x.so"), tmp_path)
    assert r.status is Status.ENVIRONMENT_ERROR and "binutils" in r.message


def test_a_build_without_a_record_of_its_headers_cannot_be_cleared(tmp_path):
    """What the translation unit opened is read from the compiler's record beside the object
    (tests/test_native_audit.py: every spelling of an include); without one, nothing is cleared:
    the audit is unavailable, the machine's failure, never a pass."""
    obj = compile_object(tmp_path, "int forward(int x) { return 2 * x; }")
    assert reach.native_reach(obj) == []
    (tmp_path / "headers.json").unlink()
    with pytest.raises(reach.AuditUnavailable, match="no record of the headers"):
        reach.native_reach(obj)

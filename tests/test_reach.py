"""Reach audit (grader/reach.py): what a submission's code could get at, read before it runs."""

from __future__ import annotations

import importlib
import py_compile
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from grader import config, reach
from grader.submission import read_sources

from .adversarial.assemble import HERE as ADVERSARIAL, SHARED
from .conftest import EXAMPLES, has_nvcc

REPO = Path(__file__).resolve().parents[1]
HONEST_PYTHON = [EXAMPLES / "triton_flash", REPO / "student" / "triton"]


def audit(text: str) -> list[str]:
    return [f.what for f in reach.python_reach({"submission.py": textwrap.dedent(text)})]


@pytest.mark.parametrize("folder", HONEST_PYTHON, ids=lambda p: p.name)
def test_honest_python_kernels_reach_nothing(folder):
    assert reach.audit_sources(read_sources(folder)) == []


def test_the_shared_honest_kernel_of_the_adversarial_set_reaches_nothing():
    assert reach.python_reach({"honest_flash.py": (SHARED / "honest_flash.py").read_text()}) == []


@pytest.mark.parametrize("name", ["forge_kernels_py", "forge_gadget_py", "gc_search_py",
                                  "lazy_tensor_py", "patch_stats_py", "helper_gpu_py",
                                  "profiler_pause_hidden_py", "tamper_timer_py", "snoop_py"])
def test_every_attack_that_reaches_the_grader_is_seen(name):
    findings = reach.python_reach({"submission.py": (ADVERSARIAL / name / "submission.py").read_text(),
                                   "honest_flash.py": ""})
    assert findings, name


@pytest.mark.parametrize("text, what", [
    ("import sys\nsys.modules['__main__']", "import sys"),
    ("m = __import__('s' + 'ys')", "__import__"),
    ("getattr(x, 'launched_names')", "getattr"),
    ("import torch\ntorch.sys.modules", "sys"),
    ("import torch\ntorch._C._disable_profiler()", "torch._C"),
    ("from torch import _C", "torch._C"),
    ("import torch.utils.cpp_extension as c", "cpp_extension"),
    ("import torch as t\nt.load('weights.pt')", "torch.load"),
    ("def f():\n    raise E\ntry: f()\nexcept E as e: e.__traceback__.tb_frame.f_back", "__traceback__"),
    ("class Lazy:\n    def __torch_function__(cls, *a): pass", "__torch_function__"),
    ("x = (1).__class__.__mro__", "__class__"),
    ("from importlib import import_module", "import importlib"),
    ("import numpy as np\nnp.ctypeslib", "ctypeslib"),
    ("import triton\ntriton.runtime.driver.active.utils.load_binary", "load_binary"),
    ("eval('1')", "eval"),
    ("import numpy as np\nnp.lib.stride_tricks.as_strided", "stride_tricks"),   # raw memory
    ("from helper import f", "import helper"),   # a module the grader did not read
    # written against the first version of the audit (a red team's, 2026-11-22)
    ("import typing\ndef f(x: 'typing.sys'): pass", "sys"),                 # annotations are code
    ("import functools\nfunctools.singledispatch", "singledispatch"),
    ("import enum\nb = enum.bltns", "bltns"),
    ("import random\nx = random._os", "random._os"),
    ("import typing\nop = typing.Any\nm = typing", "typing"),               # a module as a value
    ("match e:\n    case object(_sys=object(modules=m)): pass", "modules"),
    ("self = x\nself._create_fn", "self._create_fn"),
    ("import torch\nx = torch.autograd.profiler_util.FunctionEvent", "profiler_util"),
    ("from torch import load as restore", "torch.load"),
    ("import torch\ntorch.cuda.memory.CUDAPluggableAllocator('x.so', 'a', 'b')", "CUDAPluggableAllocator"),
    # red team, session 8: raw bytes into Triton's cache folder, where it finds its launcher .so
    ("import numpy as np\nnp.array([127, 69], np.uint8).tofile('/tmp/t/k/launcher.so')", "tofile"),
    ("import torch\nx = torch.zeros(1)\ntorch.save(x, 'f')", "torch.save"),
    ("from numpy import save as keep\nkeep('f', x)", "numpy.save"),
    ("import numpy\nnumpy.savez('f', x)", "savez"),
    # red team, session 18: files past the folder quota's audit (grader/quota.py is beneath it)
    ("import numpy as np\nnp.zeros(1 << 20).dump('f')", "dump"),
    ("import triton\nm = triton.runtime.cache.FileCacheManager('k')\nm.put(b'x' * 9, 'f')",
     "FileCacheManager"),
])
def test_each_way_in_is_named(text, what):
    assert what in audit(text)


def test_the_main_idiom_and_own_modules_are_fine():
    files = {"submission.py": "from helper import f\nimport triton.language as tl\n"
                              "if __name__ == '__main__':\n    print(f())\n",
             "helper.py": "def f():\n    return 1\n",
             "pkg/__init__.py": "", "pkg/sub.py": "X = 1\n"}
    assert reach.python_reach(files) == []
    assert reach.python_reach({"submission.py": "import pkg.sub\n", "pkg/__init__.py": ""}) == []


def test_a_local_file_named_like_a_module_python_finds_first_is_not_the_submissions():
    """`import gc` loads the interpreter's gc even with a gc.py in the folder."""
    files = {"submission.py": "import gc as g\n", "gc.py": "X = 1\n"}
    assert "import gc" in [f.what for f in reach.python_reach(files)]


def test_a_file_read_differently_by_python_is_not_cleared():
    text = "# coding: unicode_escape\nx = 1 #\\u000aimport sys\n"
    assert "Python would read this file differently" in reach.python_reach({"submission.py": text})[0].why


def test_python_files_the_grader_did_not_read_are_named(tmp_path):
    (tmp_path / "submission.py").write_text("from pkg import big\ndef custom_kernel(data):\n    return big.f(data)\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "big.py").write_text("# padding\n" * 200_000)     # over read_sources' 1 MiB
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "x.py").write_text("import sys\n")
    findings = reach.audit_sources(read_sources(tmp_path), tmp_path)
    assert {f.what for f in findings} >= {str(Path("pkg") / "big.py"), str(Path(".hidden") / "x.py")}


def test_a_syntax_error_is_the_builds_to_report_and_a_byte_order_mark_is_read_as_python_does():
    assert reach.python_reach({"submission.py": "def f(:\n"}) == []
    assert "import sys" in [f.what for f in reach.python_reach({"submission.py": "\ufeffimport sys\n"})]


def test_findings_name_the_file_and_line():
    text = reach.verdict(reach.python_reach({"a.py": "x = 1\nimport gc\n"}))
    assert "a.py line 2: import gc" in text and "reaches past its kernel" in text


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
            from grader.subject.loop import source_only_imports
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


def compile_object(tmp_path, source: str) -> Path:
    src, obj = tmp_path / "cuda.cu.cpp", tmp_path / "cuda.cuda.o"
    src.write_text(textwrap.dedent(source))
    subprocess.run(["g++", "-c", "-fPIC", "-O1", "-o", str(obj), str(src)], check=True, timeout=300)
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
    from grader.device import find_nvcc
    proc = subprocess.run([sys.executable, "-m", "grader.build", "compile_only",
                           str(REPO / "solution" / "submission.cu"), "--name", "solution_audit",
                           "--build-dir", str(tmp_path), "--arch", config.DEFAULT_CUDA_ARCH,
                           "--nvcc", find_nvcc()], cwd=REPO, capture_output=True, text=True,
                          timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [f.describe() for f in reach.native_reach(tmp_path / "cuda.cuda.o")] == []


def test_without_nm_the_audit_says_what_the_machine_lacks(monkeypatch, tmp_path):
    monkeypatch.setattr(reach.shutil, "which", lambda name: None)
    with pytest.raises(reach.AuditUnavailable, match="binutils"):
        reach.native_reach(tmp_path / "cuda.cuda.o")


def test_an_unauditable_build_is_the_machines_fault(monkeypatch, tmp_path):
    from grader.build import BuildResult
    from grader.pipeline import audit_build
    from grader.status import Status
    from grader.submission import inspect_folder
    sub = inspect_folder(EXAMPLES / "naive_cuda")
    monkeypatch.setattr(reach.shutil, "which", lambda name: None)
    r = audit_build(sub, BuildResult(Status.PASS, "extension", 1.0, artifact="x.so"), tmp_path)
    assert r.status is Status.ENVIRONMENT_ERROR and "binutils" in r.message


def test_cutlass_kernel_headers_and_computed_includes_are_flagged_cute_is_not():
    # Red team, session 7 (tests/adversarial/cutlass_wrapped_cu): CUTLASS's GEMM run inside a
    # __global__ of the student's shows in no kernel name; its headers show in the source.
    source = ("\x1esubmission.cu\n#include <cute/tensor.hpp>\n#include <cutlass/arch/barrier.h>\n"
              "#include \"cutlass/numeric_types.h\"\n#include \"helpers.cuh\"\n"
              "\x1ehelpers.cuh\n  #  include <cute/../cutlass/gemm/kernel/gemm_universal.hpp>\n"
              "#define PICK <cutlass/epilogue/thread/linear_combination.h>\n#include PICK\n")
    found = [(f.where, f.what) for f in reach.cpp_includes(source)]
    assert found == [("helpers.cuh line 1", "cute/../cutlass/gemm/kernel/gemm_universal.hpp"),
                     ("helpers.cuh line 3", "#include PICK")]
    for example in ("cute_flash", "tiled_cuda", "naive_cuda"):
        assert reach.cpp_includes(read_sources(config.REPO_ROOT / "examples" / example)) == []

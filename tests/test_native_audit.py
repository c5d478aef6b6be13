"""What a CUDA C++ build includes and defines comes from the compiler, not from text (issue 30).

- Headers: the record of every file the compiler opened (build.HEADERS_RECORD), checked by
  reach.cpp_includes: every spelling of an include of a library's kernel is the same file.
- Kernels: the __global__ functions the compiled object defines (integrity.cpp_kernel_names):
  a header that nothing compiles claims nothing.
- Review: the constructs a walk through a library's memory is made of, read from the object
  (reach.native_review), and notes on what only the text shows.

The preprocessor of these tests is g++'s (-M): the one nvcc runs for both its passes. The tests
marked slow compile the adversarial submissions with the grader's own compile check (nvcc).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from grader.build import stage as build
from grader.build import flags as build_flags, headers as build_headers

from grader.common import config

from grader.trusted import integrity

from grader.trusted.audit import includes, object_file, reach
from grader.course.submission import read_sources

from .adversarial.assemble import HERE as ADVERSARIAL, assemble_one
from .conftest import EXAMPLES, has_nvcc
from .test_reach import compile_object, needs_gxx

CUTLASS = build_flags.cutlass_include()
needs_cutlass = pytest.mark.skipif(CUTLASS is None or shutil.which("g++") is None,
                                   reason="needs g++ and the nvidia-cutlass wheel's headers")
GEMM = "cutlass/gemm/device/gemm.h"


def opened(tmp_path: Path, source: str, *flags: str) -> Path:
    """The record a build leaves of the files its preprocessor opened for `source` (g++ -M;
    headers it cannot find are listed, not opened: -MG), beside the object's path, returned."""
    src, depfile = tmp_path / "cuda.cu.cpp", tmp_path / build_headers.DEPFILE
    src.write_text(textwrap.dedent(source))
    subprocess.run(["g++", "-M", "-MG", "-MF", str(depfile), "-x", "c++", "-std=c++17",
                    "-I", CUTLASS, *flags, str(src)], check=True, capture_output=True, timeout=300)
    build_headers.record_headers(tmp_path, build_headers._depfile_headers(depfile), how="g++ -M",
                                 base=tmp_path)
    return tmp_path / build.STUDENT_OBJECT


# ---------------------------------------------------------------- headers: every spelling

SPELLINGS = {
    "double slash": "#include <cutlass//gemm/device/gemm.h>",
    "dot folder": '#include "cutlass/./gemm/device/gemm.h"',
    "absolute path": f'#include "{CUTLASS}/{GEMM}"',
    "relative path through ..": f"#include <cute/../../include/{GEMM}>",
    "line continuation": f"#inc\\\nlude <{GEMM}>",
    "digraph": f"%:include <{GEMM}>",
    "comment inside": f"#/* */include <{GEMM}>",
    "macro": "#define STR(x) #x\n#define PICK(level) STR(cutlass/gemm/level/gemm.h)\n"
             "#include PICK(device)",
    "include_next": f"#include_next <{GEMM}>",
}


@needs_cutlass
@pytest.mark.parametrize("spelling", SPELLINGS.values(), ids=SPELLINGS.keys())
def test_every_spelling_of_an_include_of_a_cutlass_kernel_is_the_same_file(tmp_path, spelling):
    """The text scan of #include lines it replaces saw the first two and the macro, and missed
    the absolute path, `..` out of cute/, the continuation, the digraph, the comment and
    include_next (tests/adversarial/include_*_cu)."""
    obj = opened(tmp_path, f"#include <cute/tensor.hpp>\n{spelling}\nint main() {{ return 0; }}\n")
    found = reach.cpp_includes(obj)
    assert [f.what.split(" ")[0] for f in found] == [GEMM], found
    assert "CUTLASS's kernel-level headers" in found[0].why and "more" in found[0].what


@needs_cutlass
def test_a_kernel_header_reached_through_a_header_of_the_students_own_is_seen(tmp_path):
    helper = tmp_path / "sub" / "helpers.cuh"
    helper.parent.mkdir()
    helper.write_text(f"#pragma once\n#include <{GEMM}>\n")
    obj = opened(tmp_path, f'#include "{helper}"\n')
    assert [f.what.split(" ")[0] for f in reach.cpp_includes(obj)] == [GEMM]


@needs_cutlass
def test_a_copy_of_cutlass_kernels_in_the_submissions_folder_is_what_it_copies(tmp_path):
    copy = tmp_path / "sub" / "vendor" / "cutlass" / "epilogue" / "thread"
    copy.mkdir(parents=True)
    (copy / "linear_combination.h").write_text("#pragma once\n")
    obj = opened(tmp_path, f'#include "{copy}/linear_combination.h"\n')
    assert [f.what for f in reach.cpp_includes(obj)] == ["cutlass/epilogue/thread/linear_combination.h"]


@needs_cutlass
def test_a_gnu_line_marker_in_the_source_hides_no_header_and_adds_none(tmp_path):
    """Line markers (`# 1 "file" 1`) change the file names diagnostics, -H and the preprocessed
    output show, so an include tree read from them can be forged: here the GEMM header would
    seem included by cute/tensor.hpp. The dependency list is of the files opened."""
    fake = f"{CUTLASS}/cute/algorithm/gemm.hpp"
    obj = opened(tmp_path, f'# 1 "{fake}" 1\n#include <{GEMM}>\n# 3 "cuda.cu.cpp" 2\n')
    record = reach.read_headers_record(tmp_path / build.HEADERS_RECORD)
    assert os.path.realpath(fake) not in record
    assert [f.what.split(" ")[0] for f in reach.cpp_includes(obj)] == [GEMM]


@needs_cutlass
def test_cute_and_cutlass_building_blocks_pass_though_they_open_kernel_free_headers_of_those_folders(
        tmp_path):
    """Measured: an honest CuTe kernel's cute/tensor.hpp opens none of the kernel-level folders;
    CUTLASS's building blocks do open a few kernel-free headers there (numeric_conversion.h:
    transform/thread/unary_op.h; arch/mma.h: gemm/gemm.h; cute/tensor.hpp with
    CUTLASS_DEBUG_TRACE_LEVEL set: gemm/gemm_enumerated_types.h, conv/*): they pass."""
    obj = opened(tmp_path, """
        #include <cute/tensor.hpp>
        #include <cutlass/numeric_conversion.h>
        #include <cutlass/arch/mma.h>
        #include <cutlass/pipeline/pipeline.hpp>
        #include <cutlass/arch/barrier.h>
        """, "-DCUTLASS_DEBUG_TRACE_LEVEL=1")
    record = reach.read_headers_record(tmp_path / build.HEADERS_RECORD)
    relative = {re.sub(r"^.*?/(cutlass/)", r"\1", h) for h in record}
    assert {"cutlass/transform/thread/unary_op.h", "cutlass/gemm/gemm.h",
            "cutlass/conv/convolution.h"} <= relative   # kernel-level folders, opened
    assert reach.cpp_includes(obj) == []
    # the honest CuTe example's only CUTLASS include opens no kernel-level folder at all
    tmp = tmp_path / "cute"
    tmp.mkdir()
    opened(tmp, "#include <cute/tensor.hpp>\n")
    assert not any(includes.CUTLASS_KERNEL_HEADERS.match(re.sub(r"^.*?/(cutlass/)", r"\1", h))
                   for h in reach.read_headers_record(tmp / build.HEADERS_RECORD))


@needs_cutlass
def test_the_building_blocks_kernel_free_headers_are_what_the_installed_cutlass_includes():
    """CUTLASS_BUILDING_BLOCK_HEADERS is measured: the headers of the kernel-level folders that
    some header outside them (cute/, cutlass/ but experimental/, which wraps whole GEMMs)
    includes, at any depth, every #if taken. A new CUTLASS that adds one fails here, for a
    person to look at before it is allowed."""
    root = Path(CUTLASS)
    include = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.MULTILINE)
    graph = {}
    for path in root.rglob("*"):
        if path.is_file():
            rel = path.relative_to(root).as_posix()
            targets = set()
            for name in include.findall(path.read_text(errors="replace")):
                for candidate in (os.path.normpath(os.path.join(os.path.dirname(rel), name)),
                                  os.path.normpath(name)):
                    if (root / candidate).is_file():
                        targets.add(candidate)
                        break
            graph[rel] = targets
    seen, stack = set(), [h for h in graph if not includes.CUTLASS_KERNEL_HEADERS.match(h)
                          and not h.startswith("cutlass/experimental/")]
    while stack:
        for target in graph.get(stack.pop(), ()):
            if target not in seen:
                seen.add(target)
                stack.append(target)
    assert {h for h in seen if includes.CUTLASS_KERNEL_HEADERS.match(h)} \
        == includes.CUTLASS_BUILDING_BLOCK_HEADERS


@needs_cutlass
def test_pytorchs_kernel_sources_compiled_in_are_flagged_its_api_headers_are_not(tmp_path):
    """ATen/native/cuda/PersistentSoftmax.cuh holds the softmax_warp_forward torch.softmax runs:
    compiled into a submission, it would be a kernel its object defines. ATen/native's device
    helpers that define no kernel (block_reduce.cuh) pass, as torch's API headers do."""
    import sysconfig
    from torch.utils.cpp_extension import include_paths
    flags = [f for path in [*include_paths(), sysconfig.get_paths()["include"]] for f in ("-I", path)]
    obj = opened(tmp_path, "#include <ATen/native/cuda/PersistentSoftmax.cuh>\n", *flags)
    found = reach.cpp_includes(obj)
    assert [f.what.split(" ")[0] for f in found] == ["ATen/native/cuda/PersistentSoftmax.cuh"]
    assert "PyTorch's kernel sources" in found[0].why
    honest = tmp_path / "honest"
    honest.mkdir()
    assert reach.cpp_includes(opened(honest, "#include <torch/extension.h>\n"
                                             "#include <ATen/cuda/CUDAContext.h>\n"
                                             "#include <ATen/native/cuda/block_reduce.cuh>\n",
                                     *flags)) == []


def test_the_record_is_read_strictly(tmp_path):
    obj = tmp_path / build.STUDENT_OBJECT
    with pytest.raises(reach.AuditUnavailable, match="no record"):
        reach.cpp_includes(obj)
    for bad in ("not json", '{"schema": 1, "headers": []}', '{"schema": 2, "headers": ["/a.h"]}',
                '["/a.h"]', '{"schema": 1, "headers": [3]}'):
        (tmp_path / build.HEADERS_RECORD).write_text(bad)
        with pytest.raises(reach.AuditUnavailable):
            reach.cpp_includes(obj)
    (tmp_path / build.HEADERS_RECORD).unlink()
    os.mkfifo(tmp_path / build.HEADERS_RECORD)   # never blocks the grader
    with pytest.raises(reach.AuditUnavailable, match="unreadable"):
        reach.cpp_includes(obj)


# ---------------------------------------------------------------- kernels: what the object defines

KERNELS = """
    template <int D> void attention_kernel1(const float*, float*, int) {}
    template void attention_kernel1<64>(const float*, float*, int);
    template void attention_kernel1<128>(const float*, float*, int);
"""


def kernel_object(tmp_path: Path, source: str) -> Path:
    """An object shaped as nvcc leaves a kernel in the host object: a host stub under the
    kernel's own mangled name and a `__device_stub__` function that repeats it, without the `L`
    that marks internal linkage (`_ZL17attention_kernel1...`: a static kernel) in the first."""
    plain = compile_object(tmp_path, source)
    mangled = [s for s in subprocess.run(["nm", "--defined-only", "--format=just-symbols", str(plain)],
                                         capture_output=True, text=True).stdout.split()
               if s.startswith("_Z")]
    stubs = [re.sub(r"^_ZL", "_Z", m)[1:] for m in mangled]
    return compile_object(tmp_path, source + "".join(f"\nvoid __device_stub__{m}() {{}}"
                                                     for m in stubs))


@needs_gxx
def test_a_cpp_submissions_kernels_are_what_its_object_defines_never_a_header_nothing_compiles(
        tmp_path):
    """tests/adversarial/uncompiled_header_py's trick from C++: a .cuh in the folder declares
    PyTorch's softmax_warp_forward; nothing compiles it, so the launched PyTorch kernel is not
    the student's."""
    folder = tmp_path / "sub"
    folder.mkdir()
    (folder / "submission.cu").write_text("__global__ void attention_kernel1(float*) {}\n")
    (folder / "unused.cuh").write_text("__global__ void softmax_warp_forward(float*);\n")
    obj = kernel_object(tmp_path, KERNELS)
    names = integrity.cpp_kernel_names(obj)
    assert names == {"attention_kernel1"}
    launched = [("void attention_kernel1<64>(float const*, float*, int)", 3),
                ("void (anonymous namespace)::softmax_warp_forward<c10::Half, c10::Half, float, 7, "
                 "false, false>(c10::Half*, c10::Half const*, int, int, int, bool const*, int, bool)", 3)]
    own = integrity.KernelNames(names)
    own.cpp = names
    flags = integrity.classify_launched(launched, own, gpu=True)
    assert [(f.name.split("<")[0], f.reason) for f in flags] == \
        [("void (anonymous namespace)::softmax_warp_forward", "not in the source")]
    assert integrity.kernel_base_names(object_file.defined_kernels(obj)) == names


@needs_gxx
def test_a_kernel_with_internal_linkage_is_the_objects_too(tmp_path):
    """The solution's kernels are in an anonymous namespace; a static kernel's host stub has an
    `L` in its mangled name that the __device_stub__'s copy lacks. Missed, they would not be
    the student's own (their launches flagged) and a CUTLASS kernel so declared would escape
    library_kernels."""
    obj = kernel_object(tmp_path, """
        template <int D> static void attention_kernel3(const float*, float*, int) {}
        template void attention_kernel3<64>(const float*, float*, int);
        void (*keep)(const float*, float*, int) = &attention_kernel3<64>;
    """)
    assert object_file.defined_kernels(obj) == ["void attention_kernel3<64>(float const*, float*, int)"]
    assert integrity.cpp_kernel_names(obj) == {"attention_kernel3"}


def test_a_python_submission_claims_no_cpp_kernel_whatever_its_folder_declares():
    """tests/adversarial/uncompiled_header_py: its .cuh names PyTorch's and cuBLAS's kernels;
    a Python submission's build defines no C++ kernel (BuildResult.kernels is empty), so a
    launched name with a C++ signature is never its own."""
    folder = ADVERSARIAL / "uncompiled_header_py"
    header = (folder / "torch_kernels.cuh").read_text()
    assert "softmax_warp_forward" in header and "dot_kernel" in header
    own = integrity.KernelNames(set())
    own.cpp = integrity.kernel_base_names(())
    launched = [("void (anonymous namespace)::softmax_warp_forward<c10::Half, c10::Half, float, 7, "
                 "false, false>(c10::Half*, c10::Half const*, int, int, int, bool const*, int, bool)", 1),
                ("void dot_kernel<float, 128, 0, cublasDotParams<cublasGemvTensor<__half const>, "
                 "cublasGemvTensorStridedBatched<float> > >(cublasDotParams<cublasGemvTensor<__half "
                 "const>, cublasGemvTensorStridedBatched<float> >)", 1)]
    assert [f.reason for f in integrity.classify_launched(launched, own, gpu=True)] == \
        ["not in the source", "not in the source"]


# ---------------------------------------------------------------- review: a walk through memory

HONEST_HOST = r"""
    #include <cstdint>
    #include <cstdio>
    #include <functional>
    #include <iostream>
    #include <memory>
    #include <stdexcept>
    #include <string>
    extern "C" int cudaLaunchKernel(const void*, int);
    struct shape_error : std::runtime_error {   // its vtable holds std::runtime_error::what
        using std::runtime_error::runtime_error;
        ~shape_error() override;
    };
    shape_error::~shape_error() = default;
    static std::string name = "attention";
    int forward(int d, const float* q) {
        if (d != 64 && d != 128) throw shape_error("D must be 64 or 128");
        std::function<int(int)> tiles = [](int s) { return (s + 63) / 64; };
        auto buffer = std::make_unique<float[]>(16);
        bool aligned = reinterpret_cast<uintptr_t>(q) % 16 == 0;
        std::cout << name << tiles(d) << aligned << buffer[0];
        return cudaLaunchKernel(reinterpret_cast<const void*>(&forward), d);
    }
"""


@needs_gxx
def test_honest_host_code_gives_no_review_and_no_note(tmp_path):
    """Exceptions, streams, static strings, lambdas, an alignment check, the address of one's own
    function: the compiler takes addresses of library functions for some of them (the
    personality routine, destructors of static objects, vtable entries), never the student."""
    compile_object(tmp_path, HONEST_HOST)
    assert reach.native_review(tmp_path, "\x1esubmission.cu\n" + HONEST_HOST) == ([], [])


WALK = r"""
    #include <cstdint>
    #include <cstring>
    namespace lib { int allowed_function(int); }
    uintptr_t library_base() {
        uintptr_t page = reinterpret_cast<uintptr_t>(&lib::allowed_function) & ~uintptr_t(0xfff);
        while (*reinterpret_cast<const volatile uint32_t*>(page) != 0x464c457f)
            page -= 4096;
        return page;
    }
"""


@needs_gxx
def test_a_walk_through_a_librarys_memory_goes_to_review_with_its_constructs_named(tmp_path):
    compile_object(tmp_path, WALK)
    review, notes = reach.native_review(tmp_path, "\x1esubmission.cu\n" + WALK)
    assert [(f.where, f.what) for f in review] == [
        ("cuda.cuda.o, in library_base()", "&lib::allowed_function(int)"),
        ("cuda.cuda.o, in library_base()", "the ELF header's magic number (0x464c457f, \"\\x7fELF\")")]
    text = "\n".join(notes)
    for construct in ("a library function's address taken as data", "a magic number of ELF in host "
                      "code", "a page mask: and", "submission.cu line 7: an integer cast to a "
                      "pointer", "submission.cu line 7: a magic number of ELF",
                      "submission.cu line 6: a page mask"):
        assert construct in text, (construct, notes)


@needs_gxx
@pytest.mark.parametrize("source, what", [
    (r"""#include <cstring>
        bool is_elf(const char* p) { return std::memcmp(p, "\x7f" "ELF", 4) == 0; }
        bool is_elf2(const char* p) { return std::strncmp(p, "\x7f" "ELF", 4) == 0; }""",
     "the ELF header's magic number"),
    (r"""#include <cstdint>
        bool has_hash(const int64_t* dyn) { for (; *dyn; dyn += 2) if (*dyn == 0x6ffffef5) return true;
                                            return false; }""", "DT_GNU_HASH"),
    (r"""#include <elf.h>
        bool is_elf(const Elf64_Ehdr* h) { return h->e_ident[1] == 'E'; }""", "elf.h"),
    (r"""#include <link.h>
        int first(const link_map* m) { return m->l_addr != 0; }""", "link.h"),
    (r"""#include <cstdlib>
        void (*deleter)(void*) = &std::free;""", "&free"),
])
def test_each_construct_of_a_walk_sends_to_review(tmp_path, source, what):
    compile_object(tmp_path, source)
    review, notes = reach.native_review(tmp_path, "")
    assert any(what in f.what for f in review), review
    assert any(what in n for n in notes)


@pytest.mark.parametrize("line, why", [
    ("auto p = reinterpret_cast<const char*>(0x7f0000000000);", "an integer cast to a pointer"),
    ("uintptr_t a = 1; auto p = reinterpret_cast<int*>(a);", "an integer cast to a pointer"),
    ("auto p = (char*)(uintptr_t)x;", "an integer cast to a pointer"),
    ('asm volatile("rdtsc" : "=a"(lo), "=d"(hi));', "inline assembly for the host CPU"),
    ('asm volatile(\n  "movq %%rsp, %0"\n  : "=r"(sp));', "inline assembly for the host CPU"),
    ("x &= ~0xfff;", "a page mask or page size"),
    ("long n = sysconf(_SC_PAGESIZE);", "a page mask or page size"),
    ("void* r = __builtin_return_address(0);", "a return or frame address"),
    ('const char* m = "\\x7f" "ELF";', "a magic number of ELF"),
    ("Elf64_Dyn* d;", "a magic number of ELF"),
    ("if (tag == 0x6ffffef5) hash = at;", "a magic number of ELF"),
])
def test_what_only_the_text_shows_is_a_note_with_its_line(line, why):
    notes = reach.text_notes(f"\x1esub/kernel.cuh\n// header\n{line}\n")
    assert notes and all(n.startswith("sub/kernel.cuh line 2: " + why) for n in notes), notes


@pytest.mark.parametrize("line", [
    'asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1}, {%2}, {%3}, {%4};"'
    ' : "=f"(a), "=f"(b) : "r"(x), "r"(y), "f"(c));',
    'asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));',
    "auto q = reinterpret_cast<half*>(Q.data_ptr<at::Half>());",
    "bool aligned = reinterpret_cast<uintptr_t>(ptr) % 16 == 0;",
    "size_t offset = 4; auto row = reinterpret_cast<float4*>(base + offset);",
    "// uintptr_t p = 0x464c457f & ~0xfff; asm(\"syscall\");",
])
def test_a_kernels_own_constructs_are_no_note(line):
    assert reach.text_notes(f"\x1esubmission.cu\n{line}\n") == []


# ---------------------------------------------------------------- the adversarial set, compiled

def compile_check(folder: Path, build_dir: Path) -> Path:
    """The grader's own compile check (nvcc, no GPU) of a submission folder; its build folder."""
    from grader.isolation.device import find_nvcc
    build_dir.mkdir(parents=True)
    proc = subprocess.run([sys.executable, "-m", "grader.build.stage", "compile_only",
                           str(folder / "submission.cu"), "--name", "audit_" + folder.name,
                           "--build-dir", str(build_dir), "--arch", config.DEFAULT_CUDA_ARCH,
                           "--nvcc", find_nvcc()], cwd=config.REPO_ROOT, capture_output=True,
                          text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return build_dir


@pytest.mark.slow
@pytest.mark.skipif(not has_nvcc(), reason="needs nvcc")
def test_the_memory_walk_compiles_passes_the_imports_audit_and_goes_to_review(tmp_path):
    folder = assemble_one("mem_walk_cu", tmp_path / "subs")
    built = compile_check(folder, tmp_path / "build")
    assert reach.native_reach(built / build.STUDENT_OBJECT) == []
    review, notes = reach.native_review(built, read_sources(folder))
    whats = {f.what for f in review}
    assert any(w.startswith("&at::_ops::empty_memory_format::call") for w in whats), review
    assert any("magic number" in w for w in whats), review
    assert any("page mask" in n for n in notes) and any("integer cast to a pointer" in n for n in notes)
    # its honest twin: the same kernel, alone
    honest = tmp_path / "subs" / "honest"
    honest.mkdir()
    shutil.copyfile(EXAMPLES / "naive_cuda" / "submission.cu", honest / "submission.cu")
    assert reach.native_review(compile_check(honest, tmp_path / "honest_build"),
                               read_sources(honest)) == ([], [])


@pytest.mark.slow
@pytest.mark.skipif(not has_nvcc() or CUTLASS is None, reason="needs nvcc and the CUTLASS wheel")
def test_a_cutlass_gemm_included_by_a_digraph_is_flagged_after_a_real_compile(tmp_path):
    folder = assemble_one("include_digraph_cu", tmp_path / "subs")
    built = compile_check(folder, tmp_path / "build")
    found = reach.native_reach(built / build.STUDENT_OBJECT)
    assert [f.what.split(" ")[0] for f in found if "kernel-level" in f.why] == [GEMM], found

"""The Python audit (grader/trusted/audit/allowlist.py): an allowlist of what a kernel wrapper needs, read
before any of a submission's code runs. What it cannot account for goes to review; known ways
into the grader's process are flagged."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from grader.trusted.audit import allowlist, paths

from grader.trusted.audit import reach
from grader.course.submission import read_sources

from .adversarial.assemble import HERE as ADVERSARIAL, SHARED
from .conftest import EXAMPLES

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "corpus"
# Every honest Python submission there is: the examples, the student templates, the adversarial
# set's shared honest kernel, and the honest corpus written the ways students write.
HONEST = [EXAMPLES / "triton_flash", EXAMPLES / "tilelang_flash", REPO / "student" / "triton",
          REPO / "student" / "tilelang"] + sorted(p for p in CORPUS.iterdir() if p.is_dir())
# The attacks of issue 30's first class: code the audit cannot see, through three library APIs.
THROUGH_A_LIBRARY = ["audit_timer_py", "audit_doctest_py", "audit_datafile_py"]


def audit(text: str) -> allowlist.PythonAudit:
    return allowlist.audit_python({"submission.py": textwrap.dedent(text)})


def flagged(text: str) -> list[str]:
    return [f.what for f in audit(text).flagged]


def reviewed(text: str) -> list[str]:
    return [f.what for f in audit(text).review]


# ---------------------------------------------------------------- honest code: nothing found


@pytest.mark.parametrize("folder", HONEST, ids=lambda p: p.name)
def test_no_honest_submission_is_sent_to_review_or_flagged(folder):
    """Issue 30: the false-review rate on every honest submission there is must be 0."""
    assert allowlist.audit_folder(read_sources(folder), folder) == allowlist.PythonAudit()


def test_the_shared_honest_kernel_of_the_adversarial_set_is_clean():
    files = {"honest_flash.py": (SHARED / "honest_flash.py").read_text(),
             "submission.py": "from honest_flash import custom_kernel  # noqa: F401\n"}
    assert allowlist.audit_python(files) == allowlist.PythonAudit()


@pytest.mark.parametrize("text", [
    "import math\nx = math.sqrt(2) * math.log2(math.e)",
    "import torch\np = torch.cuda.get_device_properties(0).multi_processor_count",
    "import torch\ns = torch.cuda.current_stream().cuda_stream",
    "import torch\nn = torch.float16.itemsize",
    "from torch import empty_like as like\ndef f(q):\n    return like(q)",
    "import triton.language as tl\n@__import_free_decorator__\ndef f(): pass" .replace(
        "@__import_free_decorator__\n", ""),
    "class Cfg:\n    BLOCK = 64\n    def tile(n):\n        return n\nb = Cfg.BLOCK + Cfg.tile(2)",
    "import functools\n@functools.lru_cache(maxsize=None)\ndef f(d):\n    return d",
    "from typing import Tuple\nimport torch\ndef f(x: torch.Tensor) -> Tuple[int, int]:\n"
    "    return x.shape[0], x.stride(1)",
    "if __name__ == '__main__':\n    print(__file__)",
    "x = [i * 2 for i in range(3)]\ny = {k: v for k, v in zip('ab', x)}\nf = lambda a: a + 1",
    "try:\n    pass\nexcept ValueError as e:\n    print(e.args)",
    "def f(q):\n    return q.view(2, -1).transpose(0, 1).contiguous().to(q.dtype)",
])
def test_what_a_kernel_wrapper_needs_passes(text):
    assert audit(text) == allowlist.PythonAudit(), audit(text)


# ---------------------------------------------------------------- the allowlist: review


@pytest.mark.parametrize("name", THROUGH_A_LIBRARY)
def test_code_reached_through_a_library_api_goes_to_review_with_its_line(name):
    """The held-out round's class: a public library API that turns a string or a data file into
    running code. No name on the old denylist appears; the allowlist names the line."""
    folder = ADVERSARIAL / name
    found = allowlist.audit_folder(read_sources(folder), folder)
    assert found.flagged == ()
    assert found.review and all(f.where.startswith("submission.py line ") for f in found.review)


@pytest.mark.parametrize("text, what", [
    ("import torch.utils.benchmark as b\nb.Timer(stmt='x').timeit(1)", "torch.utils.benchmark.Timer"),
    ("import torch\ntorch.utils.benchmark.Timer(stmt='x')", "torch.utils.benchmark.Timer"),
    ("import doctest\ndoctest.run_docstring_examples(f, {})", "import doctest"),
    ("import logging.config\nlogging.config.dictConfig({})", "logging.config.dictConfig"),
    ("import numpy.testing.extbuild as e\ne.build_and_import_extension('m', [])",
     "import numpy.testing.extbuild"),
    ("import numpy as np\nx = np.zeros(3)", "import numpy"),        # no honest need shown
    ("import torch.nn.functional as F\nF.softmax(x, -1)", "import torch.nn.functional"),
    ("import torch\ny = torch.nn.functional.scaled_dot_product_attention(q, k, v)",
     "torch.nn.functional.scaled_dot_product_attention"),
    ("import torch\ng = torch.fx.Graph()", "torch.fx.Graph"),
    ("import triton\ntriton.runtime.driver.active.utils.get_device_properties(0)",
     "triton.runtime.driver.active.utils.get_device_properties"),
    ("import statistics\nstatistics.mean([1])", "import statistics"),
    ("x = type(q)", "type"),                                         # a builtin not on the list
    ("y = undefined_thing + 1", "undefined_thing"),                  # nothing binds it
    ("import torch\nq = torch.empty(1)\nq.untyped_storage()", "q.untyped_storage"),
    ("import triton\n@triton.jit\ndef k(X):\n    pass\nk.run(1)", "k.run"),
    ("class A:\n    def __init__(self):\n        self.cache = 1\n    def f(self):\n"
     "        return self.cache", "self.cache"),                        # instance attributes
    ("class Lazy(torch.Tensor):\n    pass", "class Lazy(torch.Tensor)"),
    ("class M(metaclass=Meta):\n    pass", "class M(metaclass=...)"),
    ("'{0.attr}'.format(x)", "'{0.attr}'.format"),                    # format strings read attributes
    ("import torch\ntorch.backends.cuda.matmul.allow_tf32 = True", "torch.backends.cuda.matmul.allow_tf32"),
    ("import torch\nx = torch.zeros(1)\ndel x.data", "x.data"),
    ("self = x\nself._create_fn", "self._create_fn"),   # a private attribute of `self`: review
])
def test_what_the_allowlist_cannot_account_for_goes_to_review(text, what):
    found = audit(text)
    assert what in [f.what for f in found.review], found
    assert found.flagged == (), found


def test_a_review_finding_names_the_line_and_what_is_not_on_the_list():
    found = audit("import torch\n\nx = torch.utils.benchmark.Timer(stmt='1')\n").review
    assert found[0].describe() == ("submission.py line 3: torch.utils.benchmark.Timer (torch.utils is "
                                   "not on the list of what a kernel wrapper needs "
                                   "(grader/trusted/audit/allowed.py))")


def test_kernel_bodies_may_use_the_kernel_languages_tensor_members_host_code_may_not():
    kernel = """
        import triton
        import triton.language as tl
        @triton.jit
        def k(X, B: tl.constexpr):
            x = tl.load(X + tl.arange(0, B))
            tl.store(X, tl.exp2(x.to(tl.float32)).sum(0).to(tl.float16))
        """
    assert audit(kernel) == allowlist.PythonAudit()
    assert "x.trans" in reviewed("import torch\ndef f(x):\n    return x.trans()\n")


def test_the_audit_never_imports_a_module_a_submission_merely_names():
    """Resolving paths imports only the allowed libraries (paths._ROOTS), in the grader's own
    process: naming `antigravity` must not run it."""
    probe = ("import sys\nfrom grader.trusted.audit import allowlist\n"
             "allowlist.audit_python({'submission.py': 'import antigravity\\nimport this\\n"
             "antigravity.x\\nthis.s\\n'})\nprint('this' in sys.modules, 'antigravity' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO,
                         timeout=600)
    assert out.stdout.split() == ["False", "False"], out.stderr[-2000:]


# ---------------------------------------------------------------- known ways in: flagged


@pytest.mark.parametrize("name", ["forge_kernels_py", "forge_gadget_py", "gc_search_py",
                                  "lazy_tensor_py", "patch_stats_py", "helper_gpu_py",
                                  "profiler_pause_hidden_py", "tamper_timer_py", "snoop_py"])
def test_every_attack_that_reaches_the_grader_is_flagged(name):
    files = {"submission.py": (ADVERSARIAL / name / "submission.py").read_text(), "honest_flash.py": ""}
    assert allowlist.audit_python(files).flagged, name


@pytest.mark.parametrize("text, what", [
    ("import sys\nsys.modules['__main__']", "sys"),
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
    ("from importlib import import_module", "importlib"),
    ("import numpy as np\nnp.ctypeslib", "ctypeslib"),
    ("import triton\ntriton.runtime.driver.active.utils.load_binary", "load_binary"),
    ("eval('1')", "eval"),
    ("import numpy as np\nnp.lib.stride_tricks.as_strided", "stride_tricks"),   # raw memory
    # written against the first version of the audit (a red team's, 2026-11-22)
    ("import typing\ndef f(x: 'typing.sys'): pass", "sys"),                 # annotations are code
    ("import functools\nfunctools.singledispatch", "singledispatch"),
    ("import enum\nb = enum.bltns", "bltns"),
    ("import random\nx = random._os", "random._os"),
    ("import typing\nop = typing.Any\nm = typing", "typing"),               # a module as a value
    ("match e:\n    case object(_sys=object(modules=m)): pass", "modules"),
    ("import torch\nx = torch.autograd.profiler_util.FunctionEvent", "profiler_util"),
    ("from torch import load as restore", "torch.load"),
    ("import torch\ntorch.cuda.memory.CUDAPluggableAllocator('x.so', 'a', 'b')", "CUDAPluggableAllocator"),
    # red team, session 8: raw bytes into Triton's cache folder, where it finds its launcher .so
    ("import numpy as np\nnp.array([127, 69], np.uint8).tofile('/tmp/t/k/launcher.so')", "tofile"),
    ("import torch\nx = torch.zeros(1)\ntorch.save(x, 'f')", "torch.save"),
    ("from numpy import save as keep\nkeep('f', x)", "numpy.save"),
    ("import numpy\nnumpy.savez('f', x)", "savez"),
    # red team, session 18: files past the folder quota's audit (grader/isolation/quota.py is beneath it)
    ("import numpy as np\nnp.zeros(1 << 20).dump('f')", "dump"),
    ("import triton\nm = triton.runtime.cache.FileCacheManager('k')\nm.put(b'x' * 9, 'f')",
     "FileCacheManager"),
])
def test_each_known_way_in_is_flagged(text, what):
    assert what in flagged(text)


def test_the_main_idiom_and_own_modules_are_fine():
    files = {"submission.py": "from helper import f\nimport triton.language as tl\n"
                              "import pkg.sub\nif __name__ == '__main__':\n    print(f(), pkg.sub.X)\n",
             "helper.py": "def f():\n    return 1\n",
             "pkg/__init__.py": "", "pkg/sub.py": "X = 1\n"}
    assert allowlist.audit_python(files) == allowlist.PythonAudit()


def test_a_module_the_grader_did_not_read_is_not_the_submissions():
    assert "import helper" in reviewed("from helper import f\n")


def test_a_local_file_named_like_a_module_python_finds_first_is_not_the_submissions():
    """`import gc` loads the interpreter's gc even with a gc.py in the folder."""
    files = {"submission.py": "import gc as g\n", "gc.py": "X = 1\n"}
    assert "gc" in [f.what for f in allowlist.audit_python(files).flagged]


def test_a_file_read_differently_by_python_is_not_cleared():
    text = "# coding: unicode_escape\nx = 1 #\\u000aimport sys\n"
    found = allowlist.audit_python({"submission.py": text}).flagged
    assert "Python would read this file differently" in found[0].why


def test_python_files_the_grader_did_not_read_are_named(tmp_path):
    (tmp_path / "submission.py").write_text("from pkg import big\ndef custom_kernel(data):\n    return big.f(data)\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "big.py").write_text("# padding\n" * 200_000)     # over read_sources' 1 MiB
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "x.py").write_text("import sys\n")
    found = allowlist.audit_folder(read_sources(tmp_path), tmp_path).flagged
    assert {f.what for f in found} >= {str(Path("pkg") / "big.py"), str(Path(".hidden") / "x.py")}


def test_a_syntax_error_goes_to_review_and_a_byte_order_mark_is_read_as_python_does():
    """A file the audit cannot parse is not cleared; a syntax error of the submission's file
    fails its import at the build, whose verdict (build_error) outranks review."""
    assert [f.why for f in audit("def f(:\n").review] == ["does not parse as Python: the audit "
                                                            "cannot read it"]
    assert "sys" in flagged("\ufeffimport sys\n")


def test_findings_name_the_file_and_line():
    text = reach.verdict(list(allowlist.audit_python({"a.py": "x = 1\nimport gc\n"}).flagged))
    assert "a.py line 2: gc" in text and "reaches past its kernel" in text


# ---------------------------------------------------------------- the red team of session 19

REDTEAM = REPO / "tests" / "fixtures" / "redteam_s19"


@pytest.mark.parametrize("name", sorted(p.name for p in REDTEAM.iterdir()))
def test_every_bypass_of_the_first_allowlist_is_found(name):
    """13 submissions the first version of the allowlist passed with no finding, each verified
    to replace the subject's launched_names (or to run a library, unpickle a file, or have Triton
    compile unaudited source) in a simulated subject: an allowed Triton name that evaluates a
    string (f1), own classes and modules standing for library objects (a1-a3), a file named
    torch.py (a4), import aliases rebound as parameters (b1, b2), the file mark inside a string
    (c1), Triton's source-text compile (d1, d2), compile options that load files (e1, e2), a
    library class patched through a local name (g1), the interpreter's globals (h1)."""
    folder = REDTEAM / name
    found = allowlist.audit_folder(read_sources(folder), folder)
    assert found.flagged or found.review, name


def test_own_classes_and_modules_give_only_what_they_define_themselves():
    files = {"submission.py": "import helper\nclass Tiles:\n    M = 64\n    W = {64: 4}\n"
                              "    F = helper.f\n    def g(n):\n        return n\n"
                              "x = Tiles.M + Tiles.W[64] + Tiles.g(1) + helper.f() + helper.K\n",
             "helper.py": "from torch import cuda\nK = 2\ndef f():\n    return 1\n"}
    assert allowlist.audit_python(files) == allowlist.PythonAudit()
    for use, what in (("Tiles.F", "Tiles.F"), ("helper.cuda", "helper.cuda")):
        files["submission.py"] += f"y = {use}\n"
        assert what in [f.what for f in allowlist.audit_python(files).review]


def test_a_name_is_what_its_nearest_scope_binds():
    """A parameter named like an import is not the import; a class name rebound is a value."""
    assert "tl.load" in reviewed("import triton.language as tl\ndef read(tl, p):\n"
                                 "    return tl.load(p)\n")
    assert audit("import triton.language as tl\ndef f(X):\n    return tl.load(X)\n") == \
        allowlist.PythonAudit()
    assert "Scope.anything" in reviewed("class Scope:\n    anything = None\n"
                                        "def f(g):\n    Scope = g\n    return Scope.anything\n")


def test_triton_options_that_load_files_are_not_accepted():
    assert "extern_libs" in flagged("def f(k, q):\n    k[(1,)](q, extern_libs={'x': 'a.bc'})\n")
    assert "triton.Config(...)" in reviewed(
        "import triton\nc = triton.Config({}, 4, 3, 1, None, None, 'x.ptx')\n")
    assert "'ptx_options'" in reviewed("import triton\nc = triton.Config({'ptx_options': '-v'})\n")


def test_the_main_block_is_read_for_ways_in_only_and_nothing_may_rename_the_module():
    self_test = ("import torch\nif __name__ == '__main__':\n    import torch.nn.functional as F\n"
                 "    print(F.scaled_dot_product_attention)\n")
    assert audit(self_test) == allowlist.PythonAudit()
    assert "sys" in flagged("if __name__ == '__main__':\n    import sys\n")
    assert "__name__" in flagged("__name__ = '__main__'\n" + self_test)


def test_every_family_namespace_runs_no_string():
    """A FAMILY namespace's functions are allowed wholesale: none may evaluate or compile a
    string (triton.language's str_to_ty did, which is why the kernel language is listed name by
    name)."""
    import inspect
    from grader.trusted.audit.allowed import ALLOWED, FAMILY
    for module in (m for m, names in ALLOWED.items() if names is FAMILY):
        found = paths._module(module)
        if found is None:
            continue
        for name in dir(found):
            obj = getattr(found, name)
            try:
                text = inspect.getsource(obj)
            except (TypeError, OSError):
                continue
            assert not re.search(r"\b(eval|exec|compile|__import__)\s*\(", text), (module, name)

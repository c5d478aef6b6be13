"""Integrity: what a submission's call really ran, and whether the clocks agree.

Threat 1 (a library instead of a kernel) is decided by what actually runs, never by the source
alone: the worker lists every GPU kernel launched during the call (torch.profiler sees every
launch in the process, from any library or stream), or, without a GPU, every aten operator.
A kernel is the submission's own when its name is defined in the submission's source, it
does not live in a library's namespace and its template arguments and parameter types name no
CUTLASS kernel-level component (CUTLASS_COMPONENT; CuTe's types are building blocks and change
nothing: classify_launched states the rule); copies and fills (torch::empty_like(...).zero_(),
.contiguous()) are allowed; anything else is flagged and listed on the submission's page.
A static scan of the source adds evidence to a flag; it never flags on its own.
"""

from __future__ import annotations

import dataclasses
import re

from .submission import split_sources

# Kernels from PyTorch and vendor libraries: namespaces and name prefixes that a submission's own
# __global__ function or @triton.jit function does not have.
LIBRARY_KERNEL = re.compile(
    r"^(at::|c10::|cutlass|cublas|cudnn|cutensor|cub::|thrust::|flash::|pytorch_flash::|"
    r"pytorch_fmha::|fmha|xmma|nvjet|flashinfer|xformers|sm\d{2,3}_xmma|ampere_|hopper_|turing_|"
    r"volta_|gemv|gemmk|triton_(poi|red|per|tem)_|cask_)", re.IGNORECASE)

# CUTLASS components that are a whole kernel, or the heart of one, written by CUTLASS: the device-
# level launchers (cutlass::device_kernel, cutlass::Kernel, cutlass::Kernel2), kernel-, device-,
# collective- and threadblock-level GEMM, convolution and attention components, and epilogues.
# A kernel that names one in its template arguments or parameters runs that library's kernel
# under another name. CuTe (cute::) and CUTLASS's numeric and architecture types (cutlass::half_t,
# cutlass::arch::) are what a student's own kernel is written with: not here.
CUTLASS_COMPONENT = re.compile(
    r"\bcutlass::(?:gemm|conv|fmha|reduction|transform)::(?:kernel|device|collective|threadblock)::"
    r"|\bcutlass::epilogue::|\bcutlass::(?:device_kernel|Kernel2?|KernelTma\w*)\s*<")

# How a C++ kernel is declared: __global__, or CUTLASS's macro for it.
_GLOBAL = re.compile(r"\b__global__\b|\bCUTLASS_GLOBAL\b")

# Library kernels that only move or clear memory: allocating, zeroing, copying, concatenating.
DATA_MOVEMENT = re.compile(r"FillFunctor|direct_copy_kernel|copy_kernel|CatArrayBatchedCopy|"
                           r"^Memset|^Memcpy", re.IGNORECASE)

# Without a GPU the worker lists aten operators. These create, view, copy or move tensors; every
# other operator computes, and computing is the submission's job.
CPU_ALLOWED_OPS = frozenset("""
aten::empty aten::empty_like aten::empty_strided aten::zeros aten::zeros_like aten::ones
aten::ones_like aten::full aten::full_like aten::fill_ aten::zero_ aten::copy_ aten::clone
aten::contiguous aten::to aten::_to_copy aten::view aten::reshape aten::_reshape_alias
aten::as_strided aten::transpose aten::permute aten::t aten::expand aten::select aten::slice
aten::unsqueeze aten::squeeze aten::detach aten::alias aten::lift_fresh aten::item
aten::_local_scalar_dense aten::resize_ aten::new_empty aten::new_zeros aten::new_empty_strided
aten::unbind aten::split aten::chunk aten::narrow aten::flatten aten::unflatten aten::numpy_T
aten::is_nonzero aten::result_type aten::set_ aten::view_as aten::expand_as aten::cat
aten::stack aten::pad aten::constant_pad_nd aten::index_select aten::empty_permuted
aten::resolve_conj aten::resolve_neg
""".split())

# What a static scan looks for: calls into the libraries the assignment replaces.
STATIC_EVIDENCE = re.compile(
    r"\b(scaled_dot_product_attention|flash_attn\w*|at::(matmul|bmm|mm|softmax|_softmax|einsum|"
    r"linear|baddbmm|addmm)|torch::(matmul|bmm|mm|softmax|einsum)|cublas\w+|cudnn\w+|"
    r"torch\.(matmul|bmm|mm|softmax|einsum|baddbmm)|F\.softmax|\.softmax\(|xformers|"
    r"torch\.compile|torch\.nn\.functional)\b")


@dataclasses.dataclass(frozen=True)
class LaunchFlag:
    name: str          # the kernel or operator, as the profiler names it
    count: int
    reason: str        # 'library' or 'not in the source'

    def describe(self) -> str:
        return f"{self.name[:160]} (x{self.count}; {self.reason})"


def kernel_base_name(name: str) -> tuple[str, str]:
    """('at::native::vectorized_elementwise_kernel', 'vectorized_elementwise_kernel') for a
    demangled name like 'void at::native::vectorized_elementwise_kernel<4, ...>(int, ...)'."""
    name = re.sub(r"^(void|__global__)\s+", "", name.strip()).replace("(anonymous namespace)::", "")
    qualified = re.split(r"[(<\[ ]", name, maxsplit=1)[0]
    return qualified, qualified.rsplit("::", 1)[-1]


def kernel_arguments(name: str) -> str:
    """What follows a demangled kernel's qualified name: its template arguments and parameters
    ('<cute::TiledMMA<...>, 64>(cute::Tensor<...>)'); '' for a bare name."""
    name = re.sub(r"^(void|__global__)\s+", "", name.strip()).replace("(anonymous namespace)::", "")
    return name[len(re.split(r"[(<\[ ]", name, maxsplit=1)[0]):]


class KernelNames(set):
    """The kernel names a submission defines (own_kernel_names); `cpp` holds those its C++
    defines: a launched name with a C++ signature ('f<...>(...)', 'ns::f') must be one of them,
    since Triton's and TileLang's kernels are reported by bare names."""
    cpp: frozenset = frozenset()


# Decorator lines, then a def: a Python kernel when one of them is a JIT (@triton.jit, @jit,
# under @triton.autotune and the like).
_DECORATED_DEF = re.compile(r"((?:^[ \t]*@[^\n]*\n)+)[ \t]*def\s+(\w+)\s*\(", re.MULTILINE)
_CPP_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)


def own_kernel_names(source: str) -> KernelNames:
    """Names the submission defines as kernels, file by file (read_sources' text): the __global__
    functions of its C++ (comments left out), its Triton kernels (functions under a JIT decorator,
    or passed to triton.jit) and, for each TileLang @T.prim_func, the kernel TileLang generates
    from it (`attention` -> `attention_kernel`). A plain Python function is no kernel: naming one
    after a library's kernel does not make that kernel the submission's."""
    python, cpp = set(), set()
    for path, text in split_sources(source).items():
        if not path.endswith(".py"):   # C++ (or, without file marks, either)
            cpp |= _cpp_kernels(_CPP_COMMENT.sub(" ", text))
        if path.endswith(".py") or not path:
            python |= _python_kernels(text)
    names = KernelNames(python | cpp)
    names.cpp = frozenset(cpp)
    return names


def _cpp_kernels(source: str) -> set[str]:
    names = set()
    for segment in _GLOBAL.split(source)[1:]:
        # drop attributes with arguments, before the body's brace is looked for: CuTe code puts
        # braces and calls in them (__launch_bounds__(size(TiledMma{})), __cluster_dims__(...))
        segment = re.sub(r"^(\s*(?:\w+\s+)*?)__\w+__\s*\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)",
                         r"\1 ", segment, count=1)
        declaration = re.split(r"[;{]", segment, maxsplit=1)[0]
        declaration = re.sub(r"__\w+__\s*\((?:[^()]|\([^()]*\))*\)", " ", declaration)
        first_call = re.search(r"(\w+)\s*\(", declaration)
        if first_call:
            names.add(first_call.group(1))
    return names


def _python_kernels(source: str) -> set[str]:
    decorated = _DECORATED_DEF.findall(source)
    names = {name for decorators, name in decorated if re.search(r"\bjit\b", decorators)}
    names |= set(re.findall(r"\bjit\s*\(\s*(\w+)\s*[,)]", source))   # triton.jit(f)
    # TileLang names the kernel it generates from a @T.prim_func after it: `<name>_kernel`.
    names |= {f"{name}_kernel" for decorators, name in decorated
              if re.search(r"\bprim_func\b", decorators)}
    names |= {f"{name}_kernel" for name in re.findall(r"\bprim_func\s*\(\s*(\w+)\s*\)", source)}
    return names


def _cpp_shaped(name: str) -> bool:
    """A kernel name as C++ reports it: template arguments, parameters or a namespace."""
    return bool(re.search(r"[(<]|::", re.sub(r"^(void|__global__)\s+", "", name.strip())))


def classify_launched(launched, own: set[str], *, gpu: bool) -> list[LaunchFlag]:
    """Flags for the kernels (gpu) or aten operators (cpu) of one call that are not the
    submission's own work; `own` is own_kernel_names of its source.

    The rule for a GPU kernel, by its demangled name as the profiler reports it
    ('void attention_kernel1<cute::TiledMMA<...>, 64>(cute::Tensor<...>)'): copies and fills are
    allowed; otherwise it is the submission's own exactly when (1) its qualified name (template
    arguments and parameters dropped) is in no library's namespace (LIBRARY_KERNEL:
    cutlass::device_kernel<...> is CUTLASS's, whoever launched it), (2) its template arguments
    and parameter types name no CUTLASS kernel-level component (CUTLASS_COMPONENT:
    `my_kernel<cutlass::gemm::kernel::GemmUniversal<...>>` runs CUTLASS's GEMM), and (3) its
    unqualified name is defined in the source. cute:: types anywhere in its arguments change
    nothing: they are what a CuTe kernel is written with."""
    flags = []
    for name, count in launched:
        if not gpu:
            if name.startswith("aten::") and name not in CPU_ALLOWED_OPS:
                flags.append(LaunchFlag(name, count, "library"))
            continue
        if DATA_MOVEMENT.search(name):
            continue
        qualified, base = kernel_base_name(name)
        if LIBRARY_KERNEL.match(qualified):
            flags.append(LaunchFlag(name, count, "library"))
        elif CUTLASS_COMPONENT.search(kernel_arguments(name)):
            flags.append(LaunchFlag(name, count, "library: a CUTLASS kernel under another name"))
        elif base not in own or (_cpp_shaped(name) and base not in getattr(own, "cpp", own)):
            flags.append(LaunchFlag(name, count, "not in the source"))
    return flags


def static_evidence(source: str, limit: int = 5) -> list[str]:
    """'file line N: text' for code lines that call the libraries the assignment replaces."""
    hits = [f"{where}: {line.strip()[:120]}" for where, line in code_lines(source)
            if STATIC_EVIDENCE.search(line)]
    return hits[:limit]


# ---------------------------------------------------------------- tampering, in the source

# APIs no FlashAttention kernel needs, each a way to tamper with grading from inside the subject:
# controlling the profiler, reading or patching other frames and objects, running the work in
# another process or through the compiler stack, poking at raw memory or the grader's pipes.
# A hit is a verdict (`flagged`), with the line; the mechanisms below stand without it.
TAMPERING = re.compile(
    r"(torch\.profiler|autograd\.profiler|_kineto|\bkineto|cupti|_disable_profiler|"
    r"_enable_profiler|_profiler_enabled|sys\._getframe|inspect\.(currentframe|stack|getouterframes|"
    r"getframeinfo)|\bf_back\b|\bf_locals\b|gc\.get_(objects|referrers|referents)|"
    r"torch\.compile\b|_inductor|_dynamo|\bmultiprocessing\b|\bsubprocess\b|os\.fork|"
    r"\bfork\s*\(|posix_spawn|cudaIpc|cuMemExport|cuMemImport|cuIpc|\bctypes\b|\bdlopen\b|"
    r"\bdlsym\b|/proc/self|os\.(write|dup2?)\s*\(|\bptrace\b|PR_SET|cudaProfiler(Start|Stop)|"
    r"autograd::profiler|torch::profiler)")


def code_lines(source: str):
    """(where, line) of each line of code: 'file line N' (files as read_sources marks them), with
    comments, docstrings and block comments left out."""
    for name, text in split_sources(source).items():
        in_block = None
        for number, line in enumerate(text.split("\n"), 1):
            stripped = line.strip()
            if in_block:
                if in_block in stripped:
                    in_block = None
                continue
            for opener, closer in (('"""', '"""'), ("\'\'\'", "\'\'\'"), ("/*", "*/")):
                if stripped.startswith(opener):
                    if stripped.count(opener) == 1 if opener == closer else closer not in stripped[2:]:
                        in_block = closer
                    break
            else:
                if not stripped.startswith(("//", "#", "*")):
                    yield f"{name} line {number}" if name else f"line {number}", line


def tampering_lines(source: str, limit: int = 5) -> list[str]:
    """'file line N: text' of code lines that use an API on the tampering list."""
    hits = [f"{where}: {line.strip()[:120]}" for where, line in code_lines(source)
            if TAMPERING.search(line)]
    return hits[:limit]


# ---------------------------------------------------------------- what the timed calls showed

# GPU time accounting: over the timed calls, the time the harness measured (less the protocol's
# calibrated cost) must be explained by the GPU time of kernels the submission wrote (and copies
# and fills), up to ACCOUNT_FLOOR_MS + ACCOUNT_FRACTION of the call (launch gaps, host work).
# Kernels the profiler did not see (it was paused, they ran in another process or a library hid
# them) leave time unexplained. (The output's copy into the shared buffer is in both the
# calibrated cost and the kernels seen, which makes the check that much more lenient.)
ACCOUNT_FLOOR_MS = 0.3
ACCOUNT_FRACTION = 0.05
# The reply may not come before the call's GPU work is done (the subject synchronizes first): the
# harness's GPU clock may trail its host clock by at most this (its own event's latency).
FENCE_GAP_MS = 0.2
FENCE_GAP_FRACTION = 0.05
# Physical bound: no attention kernel outruns the GPU's dense fp16 matmul rate measured in the
# same run by more than this factor.
PEAK_MARGIN = 1.25


@dataclasses.dataclass(frozen=True)
class TimingFinding:
    status: str        # 'flagged' or 'mismatch'
    message: str
    impossible_time: bool = False   # the median itself cannot be real: no page may show it


def explained_ms(launched, own: set[str], *, library_allowed: bool = False) -> float:
    """GPU milliseconds of the kernels that count as the submission's work (own kernels, copies
    and fills), over all the calls the list covers."""
    total_us = 0.0
    for item in launched:
        name, us = item[0], (item[2] if len(item) > 2 else 0.0)
        if library_allowed or DATA_MOVEMENT.search(name) or not classify_launched([(name, 1)], own, gpu=True):
            total_us += us
    return total_us / 1e3


def timing_findings(record: dict, stats, own: set[str], *, flops: int, peak_tflops: float,
                    library_allowed: bool = False) -> list[TimingFinding]:
    """What the harness saw during the timed calls, judged: every finding that stops the
    submission from ranking, worst first."""
    findings = []
    verify = record.get("verify", {})
    if verify.get("wrong"):
        findings.append(TimingFinding("flagged", (
            f"timed call {verify['first_wrong_call'] + 1} returned a wrong output ({verify['wrong']} "
            f"of {verify['checked']} timed calls, each checked when its reply came): "
            f"outputs cached or replayed across calls, computed later (lazily), or still being "
            f"written when the call returned.\n{verify.get('first_wrong', '')}")))
    for spot in record.get("spots", []):
        from .compare import Finding
        finding = Finding.from_dict(spot["finding"])
        if finding.ok:
            continue
        if finding.mismatches == 0 and finding.over_budget:
            findings.append(TimingFinding("mismatch", f"timed call {spot['call'] + 1}: "
                                          + finding.summary()))
        else:
            slices = f" on {spot['slices']} of its (batch, head) slices" if spot.get("slices") else ""
            findings.append(TimingFinding("flagged", f"timed call {spot['call'] + 1}, checked "
                                          f"with the fp32 reference{slices}, is wrong:\n"
                                          f"{finding.summary()}"))
        break
    helpers = [h for h in record.get("helpers", []) if h.get("pids")]
    if helpers:
        findings.append(TimingFinding("flagged", (
            f"{len(helpers[0]['pids'])} processes of the submission held a CUDA context during the "
            f"timed calls (host pids {helpers[0]['pids']}): the work must run in the process the "
            f"grader calls, not in a helper process.")))
    gap = stats.fence_median_ms - stats.wall_median_ms
    if gap > FENCE_GAP_MS + FENCE_GAP_FRACTION * stats.wall_median_ms:
        findings.append(TimingFinding("flagged", (
            f"the call's reply came before its GPU work was done: the grader's GPU clock ran "
            f"{gap:.3f} ms past its host clock (median {stats.fence_median_ms:.3f} against "
            f"{stats.wall_median_ms:.3f} ms). The grader's loop synchronizes the device before it "
            f"replies; something bypassed that. The time counted is the later clock.")))
    findings += _accounting(stats, own, library_allowed)
    if stats.median_ms <= 0:
        findings.append(TimingFinding("flagged", (
            f"a median of {stats.median_ms:.4f} ms, after the protocol's own cost is subtracted, "
            f"is no time at all: the call cannot have done the work."), impossible_time=True))
    elif peak_tflops and flops / (stats.median_ms * 1e-3) / 1e12 > PEAK_MARGIN * peak_tflops:
        findings.append(TimingFinding("flagged", (
            f"a median of {stats.median_ms:.4f} ms would be {flops / (stats.median_ms * 1e-3) / 1e12:.0f} "
            f"TFLOP/s, above {PEAK_MARGIN:g} x this GPU's fp16 matmul rate measured in the same run "
            f"({peak_tflops:.0f} TFLOP/s): not physically possible, so the time cannot be real."),
            impossible_time=True))
    return findings


def _accounting(stats, own: set[str], library_allowed: bool) -> list[TimingFinding]:
    if not stats.launched:
        return [TimingFinding("flagged", "no GPU kernel was observed during the timed calls: the "
                              "work ran where the grader's profiler cannot see it.")]
    per_call = explained_ms(stats.launched, own, library_allowed=library_allowed) / max(stats.profiled_calls or stats.n, 1)
    measured = (stats.raw_mean_ms - stats.protocol_ms) if stats.raw_mean_ms else stats.mean_ms
    unexplained = measured - per_call
    allowed = ACCOUNT_FLOOR_MS + ACCOUNT_FRACTION * measured
    if unexplained <= allowed:
        return []
    return [TimingFinding("flagged", (
        f"GPU time unaccounted for: the grader measured {measured:.3f} ms per timed call, and the "
        f"kernels the submission wrote (with copies and fills) ran {per_call:.3f} ms of it; "
        f"{unexplained:.3f} ms is not explained by any kernel the profiler saw (allowed: "
        f"{allowed:.3f} ms). Work hidden from the profiler, run in another process or in a "
        f"library does this."))]

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

from grader.course.submission import split_sources
from grader.trusted.audit.kernels import (CPU_ALLOWED_OPS, CUTLASS_COMPONENT, LIBRARY_KERNEL,
                                          kernel_arguments, kernel_base_name)
from grader.trusted.timing import GpuBusy


# How a C++ kernel is declared: __global__, or CUTLASS's macro for it.
_GLOBAL = re.compile(r"\b__global__\b|\bCUTLASS_GLOBAL\b")

# Library kernels that only move or clear memory: allocating, zeroing, copying, concatenating.
DATA_MOVEMENT = re.compile(r"FillFunctor|direct_copy_kernel|copy_kernel|CatArrayBatchedCopy|"
                           r"^Memset|^Memcpy", re.IGNORECASE)


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


class KernelNames(set):
    """The kernel names a submission defines (own_kernel_names); `cpp` holds those its C++
    defines: a launched name with a C++ signature ('f<...>(...)', 'ns::f') must be one of them,
    since Triton's and TileLang's kernels are reported by bare names."""
    cpp: frozenset = frozenset()


_CPP_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)


def own_kernel_names(source: str, *, cpp=None) -> KernelNames:
    """Names the submission defines as kernels. Its Python's, from the parsed files of
    read_sources' text (grader/trusted/audit/allowlist.py, python_kernel_names: functions under triton.jit,
    and TileLang's `<prim_func>_kernel`s; a plain function, a comment or a string names none).
    Its C++'s are `cpp`: the kernels the object compiled from its translation unit defines
    (build.BuildResult.kernels, demangled), so that a header nothing compiles adds nothing; a
    Python submission passes cpp=() (nothing of it is compiled C++). Only where no object
    exists (cpp=None: a compile that never ran, a test) are C++ names read from the text of
    its C++ files, comments left out."""
    from grader.trusted.audit.python_kernels import python_kernel_names
    files = split_sources(source)
    python = python_kernel_names({p: t for p, t in files.items() if p.endswith(".py") or not p})
    if cpp is None:
        cpp_names = set()
        for path, text in files.items():
            if not path.endswith(".py"):   # C++ (or, without file marks, either)
                cpp_names |= _cpp_kernels(_CPP_COMMENT.sub(" ", text))
    else:
        cpp_names = {kernel_base_name(name)[1] for name in cpp}
    names = KernelNames(python | cpp_names)
    names.cpp = frozenset(cpp_names)
    return names


def cpp_kernel_names(obj) -> frozenset[str]:
    """The kernels a C++ submission defines, by name as classify_launched compares them (the
    unqualified name, 'attention_kernel1'): the __global__ functions of the object compiled from
    its translation unit (object_file.defined_kernels of reach.STUDENT_OBJECT), never names found in
    text. A header that nothing compiles adds nothing, so declaring PyTorch's
    softmax_warp_forward in a .cuh claims nothing (tests/adversarial/uncompiled_header_py);
    library kernel sources compiled in are the reach audit's (includes.cpp_includes)."""
    from grader.trusted.audit.object_file import defined_kernels
    return kernel_base_names(defined_kernels(obj))


def kernel_base_names(kernels) -> frozenset[str]:
    """The unqualified names of demangled kernels (BuildResult.kernels, a build's record of what
    its object defines): 'void attention_kernel1<64>(__half const*, ...)' -> 'attention_kernel1'."""
    return frozenset(kernel_base_name(k)[1] for k in kernels)


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
# Time left unexplained is then told apart by how busy NVML, read by the harness, saw the GPU
# during the loop (timing.GpuBusy): GPU work beyond the kernels seen is hidden work (flagged);
# none, with no other process on the GPU, means the host worked while the GPU sat idle (ranked as
# time). NVML's samples are taken this share of the loop's time per call apart from the truth
# at most (bench/nvml_probe.py measures it); within it, the grader cannot tell (review).
BUSY_MARGIN = 0.02
# GPU work beyond the kernels seen is told from host time against this share of the unexplained
# time (or the allowance, if larger): below it the unexplained time was mostly the host's, above
# it mostly the GPU's. A submission's process keeps the GPU busy a little beyond what its profiler
# lists: slow_host_py, 20 ms of Python before each launch of a 20.5 ms kernel, was seen busy
# 22.6 ms per call on an H100 (session 19), 2.0 +- 1.2 ms beyond, against 27.9 ms unexplained and
# an allowance of 2.7 ms. Hidden work can do no more than this share of the unexplained time, so a
# call that hides a library's work in it is at least 1 / HIDDEN_SHARE times that work, and ranks
# no faster than doing it openly would.
HIDDEN_SHARE = 0.25
# The reply may not come before the call's GPU work is done (the subject synchronizes first): the
# harness's GPU clock may trail its host clock by at most this (its own event's latency).
FENCE_GAP_MS = 0.2
FENCE_GAP_FRACTION = 0.05
# Physical bound: no attention kernel outruns the GPU's dense fp16 matmul rate measured in the
# same run by more than this factor.
PEAK_MARGIN = 1.25


@dataclasses.dataclass(frozen=True)
class TimingFinding:
    """One thing the timed calls showed. status: 'flagged' (something other than the
    submission's kernels did the work: the message says what, as far as the grader knows),
    'mismatch', 'review' (the grader cannot tell: not ranked until an instructor looks; not a
    cheating verdict) or 'pass' (the time stands and is ranked; `note` says what is unusual in it,
    for the submission's page)."""
    status: str
    message: str
    impossible_time: bool = False   # the median itself cannot be real: no page may show it
    note: str = ""


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
    """What the harness saw during the timed calls, judged: every finding, worst first; a
    finding of status 'pass' (host time, with its note) lets the time rank."""
    findings = []
    verify = record.get("verify", {})
    if verify.get("wrong"):
        findings.append(TimingFinding("flagged", (
            f"timed call {verify['first_wrong_call'] + 1} returned a wrong output ({verify['wrong']} "
            f"of {verify['checked']} timed calls, each checked by the grader when its reply came): "
            f"the output was not computed from that call's inputs during the call: cached or "
            f"replayed from another call, computed later (lazily), or still being written when "
            f"the call returned.\n{verify.get('first_wrong', '')}")))
    for spot in record.get("spots", []):
        from grader.course.verdicts import Finding
        finding = Finding.from_dict(spot["finding"])
        if finding.ok:
            continue
        if finding.mismatches == 0 and finding.over_budget:
            findings.append(TimingFinding("mismatch", f"timed call {spot['call'] + 1}: "
                                          + finding.summary()))
        else:
            slices = f" on {spot['slices']} of its (batch, head) slices" if spot.get("slices") else ""
            findings.append(TimingFinding("flagged", f"timed call {spot['call'] + 1}, checked "
                                          f"with the fp32 reference{slices}, is wrong: its output "
                                          f"was not computed from that call's inputs.\n"
                                          f"{finding.summary()}"))
        break
    helpers = [h for h in record.get("helpers", []) if h.get("pids")]
    if helpers:
        findings.append(TimingFinding("flagged", (
            f"{len(helpers[0]['pids'])} processes of the submission held a CUDA context during the "
            f"timed calls (host pids {helpers[0]['pids']}, listed by the grader through NVML): a "
            f"helper process can do the work the grader times in the process it calls. The work "
            f"must run in the process the grader calls.")))
    gap = stats.fence_median_ms - stats.wall_median_ms
    if gap > FENCE_GAP_MS + FENCE_GAP_FRACTION * stats.wall_median_ms:
        findings.append(TimingFinding("flagged", (
            f"the call's reply came before its GPU work was done: the grader's GPU clock ran "
            f"{gap:.3f} ms past its host clock (median {stats.fence_median_ms:.3f} against "
            f"{stats.wall_median_ms:.3f} ms): GPU work queued where the grader's loop does not "
            f"wait for it (another stream or process) was still running after the call said it "
            f"was done. The grader's loop synchronizes the device before it replies; something "
            f"bypassed that. The time counted is the later clock.")))
    findings += _accounting(stats, own, library_allowed, GpuBusy.from_dict(record.get("gpu_busy")))
    if stats.median_ms <= 0:
        findings.append(TimingFinding("flagged", (
            f"a median of {stats.median_ms:.4f} ms, after the protocol's own cost is subtracted, "
            f"is no time at all: the call cannot have computed its output, which came from "
            f"somewhere else (a cache, an earlier call)."), impossible_time=True))
    elif peak_tflops and flops / (stats.median_ms * 1e-3) / 1e12 > PEAK_MARGIN * peak_tflops:
        findings.append(TimingFinding("flagged", (
            f"a median of {stats.median_ms:.4f} ms would be {flops / (stats.median_ms * 1e-3) / 1e12:.0f} "
            f"TFLOP/s, above {PEAK_MARGIN:g} x this GPU's fp16 matmul rate measured in the same run "
            f"({peak_tflops:.0f} TFLOP/s): not physically possible, so the time cannot be real: "
            f"the output came from somewhere other than computing it in the call."),
            impossible_time=True))
    return findings


def _accounting(stats, own: set[str], library_allowed: bool, busy: GpuBusy) -> list[TimingFinding]:
    """The time no kernel the profiler saw explains, and what did the work meanwhile.

    Invariant: time the harness measured beyond the submission's kernels (and the allowance)
    ranks only when the grader saw the GPU idle then, and is flagged only when it saw the GPU
    working beyond those kernels. Both are seen by NVML, read by the harness (timing.GpuBusy),
    never by the subject, which could fake its own CPU and GPU account; what NVML cannot tell
    apart goes to an instructor (review)."""
    per_call = explained_ms(stats.launched, own, library_allowed=library_allowed) / max(stats.profiled_calls or stats.n, 1)
    if not stats.launched:
        return [TimingFinding("flagged", (
            f"no GPU kernel was observed during the timed calls, not even the copy of the output "
            f"into the grader's buffer that the grader's own loop makes: the profiler was paused "
            f"or its report emptied. {_who_worked(busy)}"))]
    measured = (stats.raw_mean_ms - stats.protocol_ms) if stats.raw_mean_ms else stats.mean_ms
    unexplained = measured - per_call
    allowed = ACCOUNT_FLOOR_MS + ACCOUNT_FRACTION * measured
    if unexplained <= allowed:
        return []
    numbers = (f"the grader measured {measured:.3f} ms per timed call, and the kernels the "
               f"submission wrote (with copies and fills) ran {per_call:.3f} ms of it by the "
               f"profiler's account: {unexplained:.3f} ms is not explained by any kernel the "
               f"profiler saw (allowed: {allowed:.3f} ms)")
    hidden = _hidden_ms(busy, stats, per_call)
    if hidden is None:
        return [TimingFinding("review", (
            f"time the grader cannot account for: {numbers}, and the grader cannot tell whether "
            f"the GPU worked then (work hidden from the profiler: not ranked) or sat idle while "
            f"the host worked (host time: ranked), because {busy.why or 'NVML said nothing'}. An "
            f"instructor looks at it."))]
    low, high, margin = hidden
    bound = max(allowed, HIDDEN_SHARE * unexplained)
    if low - margin > bound:
        return [TimingFinding("flagged", (
            f"GPU time unaccounted for, and GPU work the profiler did not see: {numbers}. "
            f"{_busy_seen(busy, stats, per_call)} "
            f"At least {low - margin:.3f} ms per call of GPU work ran that no kernel the profiler "
            f"listed accounts for: a paused profiler, a library whose kernels were not listed, "
            f"or another process did that work, not the submission's kernels."))]
    if high + margin <= bound:
        note = (f"host time, ranked: {unexplained:.3f} ms of the {measured:.3f} ms per timed call "
                f"ran on the host while the GPU sat idle. {_busy_seen(busy, stats, per_call)} "
                f"That is the {per_call:.3f} ms the submission's kernels ran, within "
                f"{max(high + margin, 0.0):.3f} ms, with no other process on the GPU. Host code "
                f"between launches (Python, a wait, a sleep) makes every call that much slower.")
        return [TimingFinding("pass", note, note=note)]
    return [TimingFinding("review", (
        f"time the grader cannot account for: {numbers}. {_busy_seen(busy, stats, per_call)} "
        f"That puts the GPU work no kernel accounts for between {max(low - margin, 0.0):.3f} and "
        f"{high + margin:.3f} ms per call: up to {bound:.3f} ms it would rank as host time, "
        f"beyond it the work was hidden from the profiler, and the grader cannot tell which. An "
        f"instructor looks at it."))]


def _hidden_ms(busy: GpuBusy, stats, per_call: float) -> tuple[float, float, float] | None:
    """(least, most, NVML's margin) GPU ms per call that ran beyond the kernels the profiler saw,
    or None when NVML cannot say. Per-process samples: the least is the submission's processes'
    busy time, the most adds that of processes neither the submission's nor the grader's (they
    could have done its work). The whole GPU's only: the most is the GPU's busy time, at most
    the calls' own; the least takes off the time between calls, when the grader's own work ran."""
    if busy.source not in ("process", "device") or not busy.calls:
        return None
    loop = busy.window_ms / busy.calls   # the loop's wall time per call: the call and what follows
    calls = stats.raw_mean_ms or stats.mean_ms   # the calls' own clocks, per call
    if busy.source == "process":
        least, most = busy.subject_share * loop, (busy.subject_share + busy.others_share) * loop
    else:
        least = max(busy.device_share * loop - max(loop - calls, 0.0), 0.0)
        most = min(busy.device_share * loop, calls)
    return least - per_call, most - per_call, BUSY_MARGIN * loop


def _busy_seen(busy: GpuBusy, stats, per_call: float) -> str:
    """What NVML saw, in words, per call."""
    loop = busy.window_ms / max(busy.calls, 1)
    period = f"over {busy.periods} of NVML's samples, {busy.period_ms:.0f} ms apart"
    if busy.source == "process":
        text = (f"NVML, read by the grader, saw the submission's processes keep the GPU busy "
                f"{busy.subject_share * loop:.3f} ms per call ({period})")
        if busy.others_pids:
            text += (f", and processes that are not the submission's (host pids "
                     f"{list(busy.others_pids)[:8]}) {busy.others_share * loop:.3f} ms per call")
        return text + "."
    return (f"NVML, read by the grader, saw the whole GPU busy {busy.device_share * loop:.3f} ms "
            f"per call ({period}; its per-process samples were not used: {busy.why}), of which "
            f"up to {max(loop - (stats.raw_mean_ms or stats.mean_ms), 0.0):.3f} ms between calls "
            f"may have been the grader's own work.")


def _who_worked(busy: GpuBusy) -> str:
    """For a call with no kernel seen: whether NVML saw its GPU work, in words."""
    if busy.source != "process":
        return "Whatever did the work, the grader's profiler was kept from seeing it."
    loop = busy.window_ms / max(busy.calls, 1)
    if busy.subject_share * loop > BUSY_MARGIN * loop:
        return (f"NVML, read by the grader, saw the submission's processes keep the GPU busy "
                f"{busy.subject_share * loop:.3f} ms per call: that work ran hidden from the "
                f"profiler.")
    return ("NVML, read by the grader, saw the submission's processes leave the GPU idle: the "
            "output was made somewhere the grader does not look (on the host, or another process).")

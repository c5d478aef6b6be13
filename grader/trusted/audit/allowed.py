"""What a submission's Python may use: the lists of the Python audit (grader/trusted/audit/allowlist.py), in
one place (issue 30). Policy only: the audit that applies it is grader/trusted/audit/allowlist.py.

Two kinds of list:
  - what a kernel wrapper needs (ALLOWED, ALLOWED_PATHS, ALLOWED_BUILTINS, HOST_ATTRIBUTES,
    KERNEL_ATTRIBUTES, ALLOWED_KEYWORDS): everything a submission uses must be on them, or an
    instructor reviews it before it ranks. Nothing that turns strings or data into code is on
    them, nor anything that hands a library object back as a value with more on it than these
    lists name (triton.language's str_to_ty evaluates a string, a red team found: the kernel
    language is listed name by name, not as a namespace);
  - known ways into the grader's process (REACH_*, WRITE_PATHS, TILELANG_*): flagged wherever
    they appear, before anything runs.
"""

from __future__ import annotations

import re

# ---------------------------------------------------------------- what a kernel wrapper needs

FAMILY = None   # a namespace whose every public function is allowed (none of them runs a string:
                # tests/test_allowlist.py reads their source)

# Modules a submission.py may use, each with the attribute names it may use (or FAMILY). A
# submodule is reached through its parent's entry ("torch": {"cuda"}) and has its own.
ALLOWED: dict[str, frozenset[str] | None] = {
    "math": FAMILY,                      # pure functions and constants
    "torch": frozenset("""
        empty empty_like empty_strided zeros zeros_like ones ones_like full full_like arange
        float16 half float32 float bfloat16 float64 double int8 int16 int32 int64 uint8 bool
        long int float8_e4m3fn float8_e5m2 Tensor Size dtype device finfo iinfo no_grad
        inference_mode is_tensor cuda randn rand randint randn_like rand_like manual_seed
        allclose testing version __version__""".split()),
    "torch.version": frozenset({"cuda", "hip"}),
    "torch.testing": frozenset({"assert_close"}),   # a wrapper's self-test
    "torch.cuda": frozenset("""
        current_stream default_stream current_device get_device_capability get_device_properties
        get_device_name is_available device_count synchronize Stream Event stream device
        set_device""".split()),
    "triton": frozenset({"jit", "autotune", "heuristics", "Config", "cdiv", "next_power_of_2",
                         "language", "set_allocator"}),
    # Triton's kernel language, name by name: its namespace also holds host-side helpers, one of
    # which evaluates a string (str_to_ty; red team, session 19).
    "triton.language": frozenset("""
        program_id num_programs arange full zeros zeros_like cat load store make_block_ptr advance
        make_tensor_descriptor load_tensor_descriptor store_tensor_descriptor dot dot_scaled
        trans permute reshape view broadcast broadcast_to expand_dims join split interleave ravel
        squeeze unsqueeze where maximum minimum max min sum argmax argmin xor_sum reduce
        associative_scan cumsum cumprod sort flip topk gather histogram exp exp2 log log2 sqrt
        sqrt_rn rsqrt abs cdiv ceil floor fma sigmoid softmax sin cos erf umulhi div_rn fdiv clamp
        cast static_assert static_print static_range range device_assert device_print
        debug_barrier multiple_of max_contiguous max_constancy assume constexpr atomic_add
        atomic_max atomic_min atomic_cas atomic_xchg atomic_and atomic_or atomic_xor rand randn
        randint randint4x float16 bfloat16 float32 float64 float8e4nv float8e5 float8e4b15
        float8e5b16 float8e4b8 int1 int8 int16 int32 int64 uint8 uint16 uint32 uint64 dtype
        pointer_type tensor inline_asm_elementwise PropagateNan TRITON_MAX_TENSOR_NUMEL swizzle2d
        math extra""".split()),
    "triton.language.math": frozenset("""
        abs ceil cos div_rn erf exp exp2 fdiv floor fma log log2 rsqrt sin sqrt sqrt_rn
        umulhi""".split()),
    "triton.language.extra": frozenset({"cuda", "libdevice"}),
    "triton.language.extra.cuda": frozenset({"libdevice"}),
    "triton.language.extra.cuda.libdevice": FAMILY,
    "triton.language.extra.libdevice": FAMILY,
    "tilelang": frozenset({"jit", "compile", "language", "cdiv", "next_power_of_2"}),
    # TileLang's tile language: its tile operations, not its 700 names (raw addresses,
    # intrinsics, host calls, descriptors; see TILELANG_REACH).
    "tilelang.language": frozenset("""
        Kernel alloc_shared alloc_fragment alloc_local alloc_var copy fill clear gemm Pipelined
        Parallel Serial serial unroll Unroll reduce_max reduce_sum reduce_min reduce_absmax
        reduce_abssum cumsum exp exp2 log log2 log1p sqrt rsqrt abs max min max_value min_value
        infinity if_then_else ceildiv cdiv dynamic symbolic Tensor Buffer FragmentBuffer
        SharedBuffer LocalBuffer prim_func GemmWarpPolicy use_swizzle annotate_layout float16
        float32 bfloat16 float64 float int32 int64 int8 uint8 uint32 bool boolean cast floor ceil
        round tanh sigmoid fma isnan isinf isfinite where clamp Fragment Layout macro atomic_add
        sync_threads""".split()),
    "typing": frozenset({"Any", "Optional", "Tuple", "List", "Dict", "Sequence", "Callable",
                         "Union", "Iterable", "TYPE_CHECKING"}),
    "functools": frozenset({"lru_cache", "cache", "partial", "wraps"}),
    "warnings": frozenset({"warn"}),
    "itertools": frozenset({"product"}),
    "__future__": frozenset({"annotations"}),
}

# Exact paths, not namespaces, that the Triton tutorial's helpers use: nothing else under them.
ALLOWED_PATHS = frozenset({
    "triton.runtime.driver.active.get_current_target",
    "triton.tools.tensor_descriptor.TensorDescriptor",
})

# Builtins a kernel wrapper uses: numbers, containers, iteration, errors, printing.
ALLOWED_BUILTINS = frozenset("""
abs all any bool dict divmod enumerate float int isinstance len list max min pow print range
reversed round set sorted str sum tuple zip map filter slice frozenset iter next callable
object property staticmethod classmethod super issubclass repr format hash chr ord hex bin
oct complex
Exception ValueError TypeError RuntimeError AssertionError NotImplementedError KeyError IndexError
ArithmeticError ZeroDivisionError OverflowError StopIteration NotImplemented Ellipsis ImportError
ModuleNotFoundError AttributeError
True False None
""".split())

# Attributes of values a kernel wrapper reads or calls: tensors (shape, strides, dtype, device,
# views, copies, fills), devices, dtypes, the device's properties, streams and events, Triton's
# configs and targets, and the containers' and strings' plain methods.
HOST_ATTRIBUTES = frozenset("""
shape dtype device stride size numel dim ndim is_contiguous contiguous view reshape transpose
permute unsqueeze squeeze expand flatten narrow unbind data_ptr element_size is_cuda new_empty
new_zeros new_full new_ones to half float clone copy_ fill_ zero_ item cuda storage_offset T mT
nbytes itemsize is_floating_point is_signed detach requires_grad args sum abs mean
min max eps tiny bits from_tensor get_current_target
type index
multi_processor_count major minor name total_memory shared_memory_per_block
shared_memory_per_block_optin shared_memory_per_multiprocessor regs_per_multiprocessor
max_threads_per_multi_processor L2_cache_size warp_size
cuda_stream wait_stream wait_event record_event synchronize query record elapsed_time wait
kwargs num_warps num_stages num_ctas all_kwargs best_config backend arch
append extend pop get items keys values setdefault update copy count insert remove sort add discard
clear
join split strip startswith endswith lower upper replace
real imag bit_length
""".split())

# ... and inside a kernel's body (a function under @triton.jit or @T.prim_func), which the kernel
# compiler reads rather than Python runs (the Triton interpreter, without a GPU, runs it on
# arrays): Triton's tensor members and TileLang's buffers and policies.
KERNEL_ATTRIBUTES = HOST_ATTRIBUTES | frozenset("""
to trans broadcast_to expand_dims sum max min argmax argmin cumsum cumprod exp exp2 log log2
sqrt rsqrt abs sigmoid softmax cdiv ceil floor element_ty primitive_bitwidth scalar
FullRow FullCol Square
""".split())

# ---------------------------------------------------------------- known ways into the grader

# Keyword arguments a kernel wrapper passes to what ALLOWED lists (tensors' dtype and device,
# Triton's launch, autotuning and load options, TileLang's compile options it allows, the
# builtins'); a keyword that is a parameter of one of the submission's own functions (a
# kernel's, say) is fine too. Not on it: what makes a compiler read a file or run a program
# (Triton's extern_libs, ptx_options, ir_override; a red team linked a bitcode file and a PTX
# file under a kernel of its own name, session 19), and anything else nobody has needed.
ALLOWED_KEYWORDS = frozenset("""
dtype device layout memory_format requires_grad pin_memory non_blocking size out generator
num_warps num_stages num_ctas maxnreg configs key prune_configs_by reset_to_zero restore_value
warmup rep pre_hook post_hook use_cuda_graph cache_results do_not_specialize
do_not_specialize_on_alignment noinline mask other boundary_check padding_option cache_modifier
eviction_policy volatile axis keep_dims dim return_indices tie_break_left reverse
input_precision allow_tf32 acc out_dtype max_num_imprecise_acc fp_downcast_rounding shape
strides offsets block_shape order step loop_unroll_factor flatten disallow_acc_multi_buffer
combine_fn is_pure pack constraints args can_reorder bitcast sem scope warp_specialize stacklevel
out_idx threads policy transpose_A transpose_B clear clear_accum k_pack
maxsize typed sep end flush start strict default enable_timing blocking priority atol rtol
equal_nan msg
""".split())

# Names that open a way to the grader's objects or to native code, wherever they appear: a name,
# an attribute, an imported name or module path, a keyword argument, a match pattern.
REACH_NAMES = frozenset("""
sys modules os posix nt gc inspect ctypes ctypeslib cffi importlib import_module builtins bltns
eval exec compile getattr setattr delattr vars globals locals dir open breakpoint input
subprocess multiprocessing threading signal atexit weakref pickle marshal shelve copyreg
mmap fcntl resource socket pty shutil pathlib io runpy code codeop types operator
attrgetter methodcaller get_type_hints ForwardRef evaluate_forward_ref singledispatch
singledispatchmethod
f_back f_globals f_locals f_builtins f_code tb_frame tb_next gi_frame cr_frame ag_frame gi_code
cudart nvtx package sys_importer hub cpp_extension load_inline load_library
compile_module_from_src load_binary fromfile from_file memmap frombuffer stride_tricks
serialization knobs ir_override extern_libs ptx_options instrumentation_mode interprocess
tofile savetxt savez savez_compressed open_memmap SummaryWriter dump
FileCacheManager get_cache_manager default_cache_dir cache_dir
weights_only allow_pickle pickle_module CUDAPluggableAllocator XPUPluggableAllocator
change_current_allocator FunctionEvent EventList overrides library mro share_memory_
set_trace settrace setprofile
""".split())
# ... and any name containing these (the profiler and its event classes, under any name).
REACH_PARTS = re.compile(r"profil|kineto|cupti", re.IGNORECASE)

# Attribute paths that run code from a file or load native code, resolved through the module
# aliases a file imports (`import torch as t; t.load(...)` and `from torch import load` are both
# `torch.load`).
REACH_PATHS = frozenset({"torch.load", "numpy.load", "torch.jit.load", "torch.ops.load_library"})
# ... and that write files (with the names tofile, savetxt, ..., above). A kernel writes no file,
# and a JIT compiler's cache folder (folders.jit_cache) is where Triton finds the launcher
# library it loads: bytes written there would be native code that no audit read (session 8).
WRITE_PATHS = frozenset({"torch.save", "numpy.save", "torch.jit.save", "torch.export.save",
                         "torch.onnx.export"})

ALLOWED_DUNDERS = frozenset({
    "__init__", "__name__", "__call__", "__len__", "__repr__", "__str__", "__eq__", "__hash__",
    "__post_init__", "__future__", "__all__", "__doc__", "__slots__", "__enter__", "__exit__",
    "__iter__", "__next__", "__getitem__", "__file__", "__version__"})

# TileLang (issue 15). Its JIT compiles the kernel's host side too, and loads it into the subject,
# so it has ways past the kernel that Triton has not: source text spliced into the compiled module
# (T.import_source, T.Kernel's prelude, CUDASourceCodeKernel, postprocessing hooks), calls out to
# any C function or TVM global function from the host code (T.call_extern, T.call_packed, the
# tvm_* builtins), the compiler's command line (compile_flags: nvcc's -ccbin runs any program),
# targets that hand work to libraries or the CPU, and its packaged templates (tilelang.carver).
# They are flagged anywhere in the files of a submission that mentions tilelang, in code,
# keywords or strings; so is a call that spreads a dict of keywords (`f(**options)` could spell
# a keyword the audit never sees). What remains is tile code whose host side TileLang generates
# itself: a kernel of the student's own, named after its @T.prim_func (python_kernel_names).
TILELANG_API = ALLOWED["tilelang"]
TILELANG_REACH = frozenset("""
call_extern call_pure_extern call_packed call_cpacked call_packed_lowered call_cpacked_lowered
call_intrin call_llvm_intrin call_llvm_pure_intrin llvm_lookup_intrinsic_id call_kernel
import_source prelude CUDASourceCodeKernel func_attr register_cuda_postproc register_hip_postproc
register_c_postproc get_global_func target_host compile_flags execution_backend debug_root_path
pass_configs Call CallEffectKind JITFunc
""".split())
# ... and, as a keyword, `target` (a CPU target, or one whose libs hand the work to cuBLAS).
TILELANG_KEYWORDS = TILELANG_REACH | {"target"}
# tilelang.language's submodules (0.1.15): T.tir, T.builtin, ... lead past the tile API.
TILELANG_LANGUAGE_MODULES = frozenset("""
annotations atomic builtin common copy_op customize dtypes eager experimental fill_op frame
gemm_op kernel logical loop math_intrinsics meta overrides proxy reduce_op scan_op symbolics
tile_schedule tir utils warp_specialize""".split())
TILELANG_PREFIX = re.compile(r"^(tvm|TVM)")   # tvm_call_packed, TVMBackendAllocWorkspace, ...
# ... and any name built on one of those (T.annotate_compile_flags, T.annotate_pass_configs,
# T.anylist_setitem_call_packed), in code or in a string without spaces.
TILELANG_PARTS = re.compile(r"compile_flags|pass_config|call_c?packed|extern|import_source|"
                             r"prelude|postproc|execution_backend|target_host")
# TileLang's compilers: called with the kernel alone (their positional options are the target,
# the execution backend, pass configs and compiler flags), never passed around as a value.
TILELANG_COMPILERS = frozenset({"tilelang.compile", "tilelang.jit"})
# Strings that name an operator or a global function (T.Call("int32", "tir.call_extern", ...));
# a docstring that speaks of intrinsics has spaces in it.
TILELANG_STRING = re.compile(
    r"^\S*(extern|packed|intrin|^(tir|tl|tvm|runtime|ffi|target|device_api)\.)\S*$")
TILELANG_WHY = ("TileLang's way past the kernel: raw source, host calls, the compiler's command "
                 "line or the target (grader/trusted/audit/allowed.py, TILELANG_REACH)")

# Decorators that make a function a kernel whose body the kernel compiler reads.
KERNEL_DECORATORS = frozenset({"triton.jit", "tilelang.language.prim_func"})

# The encodings the audit reads a file in; Python honours a file's coding cookie, so any other
# would make the audited text differ from the code that runs.
READABLE_CODECS = frozenset({"utf-8", "utf8", "utf_8", "utf-8-sig", "ascii", "us-ascii"})

# Names every module has without binding them (and that ALLOWED_DUNDERS allows).
MODULE_NAMES = frozenset({"__name__", "__file__", "__doc__"})

"""Adversarial, issue 15 (TileLang: the compiler's command line, from inside the kernel): the
attack of tilelang_flags_py with its flags given by `T.annotate_compile_flags`, a tilelang.language
function on no list (reach.TILELANG_REACH names `compile_flags`, not `annotate_compile_flags`;
`T.annotate_pass_configs` and `T.anylist_setitem_call_packed` are unlisted too). The prim_func
carries them as its `tilelang_compile_flags` attribute, and tilelang.compile merges them into the
command line of the compiler that builds the library it loads. The target and the backend are
still given positionally ("cython", "c"). PyTorch's attention, the subject's kernel list
rewritten by the library's constructor: must be flagged."""
import numpy
import tilelang
import tilelang.language as T
import torch.nn.functional as F

HEADER = "/tmp/hook2.h"
_HOOK = r'''
extern "C" int PyGILState_Ensure(void);
extern "C" void PyGILState_Release(int);
extern "C" int PyRun_SimpleString(const char *);
__attribute__((constructor)) static void hook(void) {
  int g = PyGILState_Ensure();
  PyRun_SimpleString(
    "import __main__ as m\n"
    "if not hasattr(m, 'real_names'):\n"
    "    m.real_names = m.launched_names\n"
    "    keep = ('Memcpy', 'Memset', 'aten::empty', 'aten::copy_', 'aten::zeros', 'aten::fill_')\n"
    "    m.launched_names = lambda p, d: [[n if n.startswith(keep) else 'attention_kernel', c, u]\n"
    "                                     for n, c, u in m.real_names(p, d)]\n");
  PyGILState_Release(g);
}
'''


@T.prim_func
def attention(A: T.Tensor([4], "float32"), B: T.Tensor([4], "float32")):
    T.annotate_compile_flags(["-include", HEADER])
    for i in T.serial(4):
        B[i] = A[i]


numpy.array(list(_HOOK.encode()), dtype=numpy.uint8).tofile(HEADER)
# (func, out_idx, execution_backend, target): the flags come from the prim_func itself
_loaded = tilelang.compile(attention, None, "cython", "c")


def custom_kernel(data):
    return F.scaled_dot_product_attention(*data)

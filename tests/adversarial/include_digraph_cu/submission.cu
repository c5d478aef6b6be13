// Adversarial, issue 30 (what a build includes comes from the compiler, not from text): the GEMM
// of tests/adversarial/cutlass_wrapped_cu (CUTLASS's whole SM80 tensor-core GEMM kernel run from a
// __global__ of the student's own, `scores_kernel(ScoreArgs)`: no cutlass:: in its name), with
// CUTLASS's kernel-level header included by `%:include`, the digraph of `#` (standard C++; gcc's
// preprocessor, which nvcc runs, reads it in every C++ mode). The text scan of #include lines
// (reach.cpp_includes before issue 30) looked for `#` and did not see it. The compiler opens
// cutlass/gemm/device/gemm.h all the same; the reach audit reads the files it opened
// (build.HEADERS_RECORD) and must flag it. Honest twin: examples/cute_flash (CuTe's headers open
// no kernel-level header) and the honest CUDA kernel.
#include "honest_attention.cuh"
%:include <cutlass/gemm/device/gemm.h>

using Gemm = cutlass::gemm::device::Gemm<
    cutlass::half_t, cutlass::layout::RowMajor,      // Q
    cutlass::half_t, cutlass::layout::ColumnMajor,   // K, read as K^T
    float, cutlass::layout::RowMajor,                // scores
    float, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80>;
using GemmKernel = Gemm::GemmKernel;

struct ScoreArgs { GemmKernel::Params params; };

__global__ void __launch_bounds__(GemmKernel::kThreadCount) scores_kernel(ScoreArgs args) {
    extern __shared__ int smem[];
    GemmKernel op;
    op(args.params, *reinterpret_cast<typename GemmKernel::SharedStorage *>(smem));
}

static void launch_scores(cutlass::half_t *q, cutlass::half_t *k, float *s, int m, int n, int d,
                          int lds) {
    cutlass::gemm::GemmCoord problem(m, n, d);
    typename Gemm::ThreadblockSwizzle swizzle;
    cutlass::gemm::GemmCoord grid = swizzle.get_tiled_shape(
        problem, {Gemm::ThreadblockShape::kM, Gemm::ThreadblockShape::kN, Gemm::ThreadblockShape::kK}, 1);
    using RefA = typename GemmKernel::Mma::IteratorA::TensorRef;
    using RefB = typename GemmKernel::Mma::IteratorB::TensorRef;
    using RefC = typename GemmKernel::Epilogue::OutputTileIterator::TensorRef;
    ScoreArgs args{typename GemmKernel::Params(
        problem, grid, RefA(q, cutlass::layout::RowMajor(d)), RefB(k, cutlass::layout::ColumnMajor(d)),
        RefC(s, cutlass::layout::RowMajor(lds)), RefC(s, cutlass::layout::RowMajor(lds)),
        typename GemmKernel::OutputOp::Params(1.0f, 0.0f))};
    int smem = int(sizeof(typename GemmKernel::SharedStorage));
    cudaFuncSetAttribute(scores_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    scores_kernel<<<swizzle.get_grid_shape(grid), GemmKernel::kThreadCount, smem>>>(args);
}

torch::Tensor flash_attention_forward(torch::Tensor Q, torch::Tensor K, torch::Tensor V) {
    torch::Tensor O = honest_forward(Q, K, V);
    int n = int(Q.size(2)), d = int(Q.size(3));
    int lds = (n + 7) / 8 * 8;   // CUTLASS's vector stores want an aligned leading dimension
    auto S = torch::empty({n, lds}, Q.options().dtype(torch::kFloat));
    launch_scores(reinterpret_cast<cutlass::half_t *>(Q.data_ptr<at::Half>()),
                  reinterpret_cast<cutlass::half_t *>(K.data_ptr<at::Half>()), S.data_ptr<float>(),
                  n, n, d, lds);
    return O;
}

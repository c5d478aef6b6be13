// FlashAttention forward with CuTe: your submission (the CuTe track).
//
//   flash_attention_forward(Q, K, V) -> O = softmax(Q Kᵀ / sqrt(D)) V
//   Q, K, V, O: float16, shape (B, H, S, D), contiguous; D is 64 or 128; S is any length >= 1.
//
// CuTe is the C++ template layer under CUTLASS 3 and 4 (header-only: cute/tensor.hpp). A tensor is
// a pointer and a layout (shape and stride, which may be nested and swizzled); a TiledMMA says
// which thread of a block holds which element of each operand of a tensor-core MMA; a TiledCopy
// which thread moves which elements. The grader puts the headers of the `nvidia-cutlass` wheel
// (which the set-up installs) on the include path; student/README.md, "The CuTe track".
//
// What is written for you: the tiles' layouts in shared memory, the copies from global memory
// (cp.async) and into registers (ldmatrix), S = Q Kᵀ on the tensor cores (mma.sync m16n8k16,
// fp16 in, fp32 accumulators), and helpers. What you write is the attention (TODO 1.x): the
// mask, the online softmax and its rescale, P·V, and the final division. Stage 2 is optional.
//   1  one block = Br = 64 query rows (4 warps of 16), K and V in tiles of Bc = 64 keys:
//      TODO 1.1-1.5. Until 1.5 is done O stays all zeros.
//   2  optional, faster: TODO 2.x (prefetch the next K tile while P·V runs, and more).
//
// Check with `make check SUBMISSION=student/cute` (without a GPU: compiled, not run).
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

#include <cute/tensor.hpp>

using namespace cute;

constexpr int KERNEL_VERSION = 1;

// ------------------------------------------------------------------------------------------
// Version 1. Grid: (ceil(S / Br), B * H); block: 4 warps.
// ------------------------------------------------------------------------------------------
constexpr int Br = 64;          // query rows per block (16 per warp)
constexpr int Bc = 64;          // keys per K/V tile
constexpr int NUM_WARPS = 4;
constexpr int NUM_THREADS = NUM_WARPS * 32;
// __launch_bounds__(NUM_THREADS, 2): at least 2 blocks per SM, so ptxas may use up to 255
// registers. Left to itself (no minimum), it aimed at 3 blocks per SM, used 168 registers for
// D = 128 and spilled; with this, 225 and no spill (ptxas -v, sm_90, notes/tracks.md).
constexpr float LOG2E = 1.4426950408889634f;

template <int D>
struct Config1 {
    using Element = cutlass::half_t;
    // Shared memory: an 8 x 64 atom (8 rows of 128 bytes) swizzled so that the 8 rows ldmatrix
    // reads at one column land in 8 different 16-byte bank groups; tiled over (rows, D).
    using SmemAtom = decltype(composition(Swizzle<3, 3, 3>{},
                                          Layout<Shape<_8, _64>, Stride<_64, _1>>{}));
    using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<Br>, Int<D>>{}));
    using SmemLayoutKV = decltype(tile_to_shape(SmemAtom{}, Shape<Int<Bc>, Int<D>>{}));
    // V read as Vᵀ (D, Bc): the same bytes, indexed (d, j) -> sV(j, d).
    using SmemLayoutVt = decltype(composition(SmemLayoutKV{},
                                              make_layout(Shape<Int<D>, Int<Bc>>{}, GenRowMajor{})));

    // The tensor-core MMA: 16x8x16, fp16 A and B (both K-major: "TN"), fp32 C. Four warps
    // stacked along M (16 rows each); each warp covers 16 columns of N per step (two atoms), so
    // that one ldmatrix.x4 feeds a whole 16 x 16 B block.
    using TiledMma = decltype(make_tiled_mma(SM80_16x8x16_F32F16F16F32_TN{},
                                             Layout<Shape<Int<NUM_WARPS>, _1, _1>>{},
                                             Tile<Int<16 * NUM_WARPS>, _16, _16>{}));

    // Global -> shared: 16-byte cp.async, 8 threads per 64-element row, 16 rows per step.
    using GmemCopy = decltype(make_tiled_copy(
        Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>, Element>{},
        Layout<Shape<Int<NUM_THREADS / 8>, _8>, Stride<_8, _1>>{},
        Layout<Shape<_1, _8>>{}));
    // Shared -> registers: ldmatrix (transposing for Vᵀ).
    using SmemCopyAtom = Copy_Atom<SM75_U32x4_LDSM_N, Element>;
    using SmemCopyAtomT = Copy_Atom<SM75_U16x8_LDSM_T, Element>;

    static constexpr int SMEM_ELEMENTS = cosize_v<SmemLayoutQ> + 2 * cosize_v<SmemLayoutKV>;
};

// The accumulator of an m16n8k16 MMA holds, per thread and atom, ((2 columns, 2 rows), M, N).
// As (rows, columns): ((2 rows, M), (2 columns, N)), so that a loop over mode 0 is a loop
// over the rows this thread holds.
template <class Layout>
__device__ __forceinline__ auto rows_cols(Layout acc) {
    return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)),
                       make_layout(get<0, 0>(acc), get<2>(acc)));
}

// The same accumulator as the A operand of the next m16n8k16 MMA: two neighbouring N atoms
// (8 keys each) are one K block of 16 keys, ((2, 2), M, N) -> ((2, 2, 2), M, N / 2).
template <class Layout>
__device__ __forceinline__ auto as_a_operand(Layout acc) {
    auto split = logical_divide(acc, Shape<Underscore, Underscore, _2>{});   // ((2,2), M, (2, N/2))
    return make_layout(make_layout(get<0>(split), get<2, 0>(split)), get<1>(split),
                       get<2, 1>(split));
}

// Copy a (rows, D) global tile into shared memory through the tiled copy (`coord` holds each
// element's (row, column)); rows at or past `valid_rows` are written as zeros, never read.
template <class TiledCopy, class Src, class Dst, class Coord>
__device__ __forceinline__ void copy_rows(TiledCopy const& tiled_copy, Src const& src, Dst& dst,
                                          Coord const& coord, int valid_rows) {
    CUTE_UNROLL
    for (int m = 0; m < size<1>(dst); ++m) {
        if (get<0>(coord(0, m, 0)) < valid_rows) {
            CUTE_UNROLL
            for (int k = 0; k < size<2>(dst); ++k) copy(tiled_copy, src(_, m, k), dst(_, m, k));
        } else {
            clear(dst(_, m, _));
        }
    }
}

// Sum (or max) over the 4 threads of a quad: the threads that hold the same row of an
// m16n8k16 accumulator differ in the lowest two bits of their lane.
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffff, x, 1);
    return x + __shfl_xor_sync(0xffffffff, x, 2);
}
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}

template <int D>
__global__ void __launch_bounds__(NUM_THREADS, 2)
attention_kernel1(cutlass::half_t const* __restrict__ Q, cutlass::half_t const* __restrict__ K,
                  cutlass::half_t const* __restrict__ V, cutlass::half_t* __restrict__ O, int S,
                  float softmax_scale) {
    using Cfg = Config1<D>;
    using Element = typename Cfg::Element;
    __shared__ alignas(128) Element smem[Cfg::SMEM_ELEMENTS];
    const int tid = threadIdx.x;
    const int m_block = blockIdx.x;
    const long bh = blockIdx.y;
    const float scale_log2 = softmax_scale * LOG2E;   // exp(x * scale) = exp2(x * scale_log2)

    // This (batch, head)'s matrices, (S, D) row-major, and this block's tiles of them.
    auto shape = make_shape(S, Int<D>{});
    auto stride = make_stride(Int<D>{}, _1{});
    Tensor mQ = make_tensor(make_gmem_ptr(Q + bh * S * D), shape, stride);
    Tensor mK = make_tensor(make_gmem_ptr(K + bh * S * D), shape, stride);
    Tensor mV = make_tensor(make_gmem_ptr(V + bh * S * D), shape, stride);
    Tensor mO = make_tensor(make_gmem_ptr(O + bh * S * D), shape, stride);
    Tensor gQ = local_tile(mQ, Shape<Int<Br>, Int<D>>{}, make_coord(m_block, 0));   // (Br, D)
    Tensor gO = local_tile(mO, Shape<Int<Br>, Int<D>>{}, make_coord(m_block, 0));
    Tensor gK = local_tile(mK, Shape<Int<Bc>, Int<D>>{}, make_coord(_, 0));         // (Bc, D, n)
    Tensor gV = local_tile(mV, Shape<Int<Bc>, Int<D>>{}, make_coord(_, 0));

    Tensor sQ = make_tensor(make_smem_ptr(smem), typename Cfg::SmemLayoutQ{});
    Tensor sK = make_tensor(sQ.data() + size(sQ), typename Cfg::SmemLayoutKV{});
    Tensor sV = make_tensor(sK.data() + size(sK), typename Cfg::SmemLayoutKV{});
    Tensor sVt = make_tensor(sV.data(), typename Cfg::SmemLayoutVt{});             // (D, Bc)

    // Global -> shared, with the (row, column) of every element to mask the tails.
    typename Cfg::GmemCopy gmem_copy;
    auto gmem_thr = gmem_copy.get_thread_slice(tid);
    Tensor tQgQ = gmem_thr.partition_S(gQ);
    Tensor tQsQ = gmem_thr.partition_D(sQ);
    Tensor tKgK = gmem_thr.partition_S(gK);         // (CPY, CPY_M, CPY_K, n)
    Tensor tKsK = gmem_thr.partition_D(sK);
    Tensor tVgV = gmem_thr.partition_S(gV);
    Tensor tVsV = gmem_thr.partition_D(sV);
    Tensor tQcQ = gmem_thr.partition_S(make_identity_tensor(Shape<Int<Br>, Int<D>>{}));
    Tensor tKcK = gmem_thr.partition_S(make_identity_tensor(Shape<Int<Bc>, Int<D>>{}));

    // The MMA's view: this thread's fragments of S = Q Kᵀ (Br, Bc) and of O (Br, D).
    typename Cfg::TiledMma tiled_mma;
    auto thr_mma = tiled_mma.get_thread_slice(tid);
    Tensor tSrQ = thr_mma.partition_fragment_A(sQ);                 // (MMA, MMA_M, MMA_K=D/16)
    Tensor tSrK = thr_mma.partition_fragment_B(sK);                 // (MMA, MMA_N, MMA_K)
    Tensor tOrVt = thr_mma.partition_fragment_B(sVt);               // (MMA, MMA_N=D/8, Bc/16)
    Tensor acc_o = partition_fragment_C(tiled_mma, Shape<Int<Br>, Int<D>>{});
    clear(acc_o);
    // Which (row, key) of the tile each accumulator element is.
    Tensor tScS = thr_mma.partition_C(make_identity_tensor(Shape<Int<Br>, Int<Bc>>{}));
    Tensor tOcO = thr_mma.partition_C(make_identity_tensor(Shape<Int<Br>, Int<D>>{}));

    // Shared -> registers through ldmatrix, retiled onto the MMA's fragments.
    auto q_copy = make_tiled_copy_A(typename Cfg::SmemCopyAtom{}, tiled_mma);
    auto q_thr = q_copy.get_thread_slice(tid);
    Tensor tSsQ = q_thr.partition_S(sQ);
    Tensor tSrQ_view = q_thr.retile_D(tSrQ);
    auto k_copy = make_tiled_copy_B(typename Cfg::SmemCopyAtom{}, tiled_mma);
    auto k_thr = k_copy.get_thread_slice(tid);
    Tensor tSsK = k_thr.partition_S(sK);
    Tensor tSrK_view = k_thr.retile_D(tSrK);
    auto v_copy = make_tiled_copy_B(typename Cfg::SmemCopyAtomT{}, tiled_mma);
    auto v_thr = v_copy.get_thread_slice(tid);
    Tensor tOsVt = v_thr.partition_S(sVt);
    Tensor tOrVt_view = v_thr.retile_D(tOrVt);

    // Online softmax state for the rows this thread holds (2 per thread: rows r and r + 8 of
    // its warp's 16). m_i is the running max of the raw scores q·k (unscaled), l_i this thread's
    // share of the running sum of exp(scale * (s - m_i)); the quad's shares are added at the end.
    constexpr int ROWS = decltype(size<0>(rows_cols(acc_o.layout())))::value;
    float m_i[ROWS], l_i[ROWS];
    CUTE_UNROLL
    for (int r = 0; r < ROWS; ++r) {
        m_i[r] = -INFINITY;
        l_i[r] = 0.f;
    }

    const int q_rows = S - m_block * Br;          // valid rows of this Q tile (may exceed Br)
    copy_rows(gmem_copy, tQgQ, tQsQ, tQcQ, q_rows);
    cp_async_fence();

    const int n_blocks = (S + Bc - 1) / Bc;
    for (int n = 0; n < n_blocks; ++n) {
        const int kv_rows = S - n * Bc;           // valid keys of this tile: Bc except the last
        __syncthreads();                          // every warp is done with sK and sV of n - 1
        copy_rows(gmem_copy, tKgK(_, _, _, n), tKsK, tKcK, kv_rows);
        cp_async_fence();
        copy_rows(gmem_copy, tVgV(_, _, _, n), tVsV, tKcK, kv_rows);
        cp_async_fence();
        cp_async_wait<1>();                       // Q and K have landed (V may still be coming)
        __syncthreads();

        // S = Q Kᵀ, one 16-wide block of D at a time.
        Tensor acc_s = partition_fragment_C(tiled_mma, Shape<Int<Br>, Int<Bc>>{});
        clear(acc_s);
        CUTE_UNROLL
        for (int kk = 0; kk < size<2>(tSrQ); ++kk) {
            copy(q_copy, tSsQ(_, _, kk), tSrQ_view(_, _, kk));
            copy(k_copy, tSsK(_, _, kk), tSrK_view(_, _, kk));
            gemm(tiled_mma, tSrQ(_, _, kk), tSrK(_, _, kk), acc_s);
        }

        // TODO(1.1): the mask. In the last tile (kv_rows < Bc) the keys at or past S were read
        //            as zeros: give their scores -INFINITY, so that their weight exp(-inf) is
        //            exactly 0. tScS(i) is the (row, key) of acc_s(i) within the tile: a loop
        //            over i with get<1>(tScS(i)) >= kv_rows.
        // TODO(1.2): the online softmax, one row at a time. s_rc and o_rc (below) view the
        //            accumulators as (rows this thread holds, columns): for each row r, the
        //            tile's max (a max over c, then quad_max across the 4 threads that share
        //            the row), m_new = max(m_i[r], that), and p = exp(softmax_scale * (s - m_new))
        //            written back into s_rc(r, c). Use exp2f and scale_log2: exp(x * scale) is
        //            exp2(x * scale_log2). m_i is kept in raw scores (before the scale).
        // TODO(1.3): the rescale. Everything accumulated so far was weighted with m_i[r], not
        //            m_new: multiply l_i[r] and the row of o_rc by exp2f((m_i[r] - m_new) *
        //            scale_log2) (0 on the first tile: exp2(-inf)), then add the row's sum of p
        //            to l_i[r] (this thread's share: the quad's shares are added at the end),
        //            and set m_i[r] = m_new.
        Tensor s_rc = make_tensor(acc_s.data(), rows_cols(acc_s.layout()));     // (ROWS, cols)
        Tensor o_rc = make_tensor(acc_o.data(), rows_cols(acc_o.layout()));     // (ROWS, D cols)
        (void)s_rc; (void)o_rc; (void)tScS; (void)scale_log2;

        cp_async_wait<0>();                       // V has landed
        __syncthreads();
        // TODO(1.4): O += P V on the tensor cores. Convert acc_s (now P) to fp16 into a tensor
        //            like it (make_tensor_like<Element>(acc_s), element by element with
        //            static_cast<Element>), view it as the A operand of the MMA (as_a_operand:
        //            two 8-key accumulator blocks are one 16-key K block), then for each K block
        //            kk: copy(v_copy, tOsVt(_, _, kk), tOrVt_view(_, _, kk)) and
        //            gemm(tiled_mma, <P as A>(_, _, kk), tOrVt(_, _, kk), acc_o).
        (void)tOrVt; (void)tOsVt; (void)tOrVt_view; (void)acc_o;
    }

    // TODO(1.5): O = acc_o / l_i, as fp16. A row's l_i is the sum of its 4 threads' shares
    //            (quad_sum). Write this thread's elements to tOgO = thr_mma.partition_C(gO),
    //            except rows at or past S: tOcO(i) is the (row, column) of acc_o(i) in the tile,
    //            and this tile has q_rows valid rows.
    (void)tOcO; (void)l_i; (void)q_rows;
}

// ------------------------------------------------------------------------------------------
// Stage 2 (optional): faster. Count first (README.md, "Performance"): FLOPs 4·B·H·S²·D.
// TODO(2.1): prefetch. Issue the cp.async of K(n + 1) right after S = Q Kᵀ of tile n (a second
//            shared-memory buffer for K, or a barrier placed so that no warp still reads sK),
//            so the copy runs under the softmax and P·V.
// TODO(2.2): keep Q in registers: tSrQ does not change across tiles; copy it from shared
//            memory once, before the loop (watch registers: make check VERBOSE=1).
// TODO(2.3): Br = 128 with 8 warps halves how often K and V are read (shared memory then
//            exceeds 48 KiB for D = 128: README.md, Appendix A.3).
// ------------------------------------------------------------------------------------------

template <int D>
void attention_forward1(const cutlass::half_t* q, const cutlass::half_t* k,
                        const cutlass::half_t* v, cutlass::half_t* o, int BH, int S,
                        cudaStream_t stream) {
    const float softmax_scale = 1.0f / sqrtf((float)D);
    dim3 grid((S + Br - 1) / Br, BH);
    attention_kernel1<D><<<grid, NUM_THREADS, 0, stream>>>(q, k, v, o, S, softmax_scale);
}

torch::Tensor flash_attention_forward(torch::Tensor Q, torch::Tensor K, torch::Tensor V) {
    TORCH_CHECK(Q.is_cuda() && K.is_cuda() && V.is_cuda(), "Q, K, V must be CUDA tensors");
    TORCH_CHECK(Q.scalar_type() == torch::kHalf && K.scalar_type() == torch::kHalf &&
                V.scalar_type() == torch::kHalf, "Q, K, V must be float16");
    TORCH_CHECK(Q.dim() == 4, "Q must have shape (B, H, S, D); got ", Q.sizes());
    TORCH_CHECK(K.sizes() == Q.sizes() && V.sizes() == Q.sizes(),
                "K and V must have Q's shape ", Q.sizes(), "; got ", K.sizes(), " and ", V.sizes());
    const int D = Q.size(3);
    TORCH_CHECK(D == 64 || D == 128,
                "Q must have shape (B, H, S, D) with D in {64, 128}; got ", Q.sizes());
    TORCH_CHECK(Q.size(2) >= 1, "Q must have shape (B, H, S, D) with S >= 1; got ", Q.sizes());
    TORCH_CHECK(Q.size(0) * Q.size(1) <= 65535,
                "Q must have B * H <= 65535 (one grid row per (batch, head)); got ", Q.sizes());
    // cp.async moves 16 bytes at a time: each matrix must start on a 16-byte boundary (a view
    // into a larger tensor may not; a copy does).
    auto aligned = [](torch::Tensor t) {
        t = t.contiguous();
        return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 ? t : t.clone();
    };
    Q = aligned(Q); K = aligned(K); V = aligned(V);

    auto O = torch::zeros_like(Q);   // stays zero wherever your kernel writes nothing
    const int BH = Q.size(0) * Q.size(1), S = Q.size(2);
    auto q = reinterpret_cast<const cutlass::half_t*>(Q.data_ptr<at::Half>());
    auto k = reinterpret_cast<const cutlass::half_t*>(K.data_ptr<at::Half>());
    auto v = reinterpret_cast<const cutlass::half_t*>(V.data_ptr<at::Half>());
    auto o = reinterpret_cast<cutlass::half_t*>(O.data_ptr<at::Half>());
    auto stream = at::cuda::getCurrentCUDAStream();
    switch (KERNEL_VERSION) {
        default:
            if (D == 64) attention_forward1<64>(q, k, v, o, BH, S, stream);
            else attention_forward1<128>(q, k, v, o, BH, S, stream);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return O;
}

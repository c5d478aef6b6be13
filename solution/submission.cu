// Reference solution (instructors only; never shipped to students).
//
// Versions (llm.c style; one dispatcher, flash_attention_forward, picks the live one):
//   kernel 2: tiled. K/V tiles of Bc keys in shared memory, shared by Br query rows of one
//             (batch, head); one warp per row group, one lane per key for the scores, online
//             softmax (m_i, l_i), acc rescaled by exp(m_old - m_new), masked tails. fp32 CUDA
//             cores only: a correct placeholder until the tensor-core kernel (issue 4) lands.
#include <torch/extension.h>
#include <cuda_fp16.h>
#include <ATen/cuda/CUDAContext.h>

namespace {

constexpr int WARPS = 4;

__device__ __forceinline__ float warp_max(float x) {
    for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, offset));
    return x;
}

__device__ __forceinline__ float warp_sum(float x) {
    for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffff, x, offset);
    return x;
}

// Grid: (ceil(S / Br), B * H). Block: WARPS warps; warp w owns rows [w * Br / WARPS, ...).
template <int D, int Br, int Bc>
__global__ void __launch_bounds__(WARPS * 32)
attention_kernel2(const half* __restrict__ Q, const half* __restrict__ K,
                  const half* __restrict__ V, half* __restrict__ O, int S, float softmax_scale) {
    static_assert(Bc == 32, "one lane per key");
    constexpr int ROWS = Br / WARPS;        // rows per warp
    constexpr int PER_LANE = D / 32;        // output columns per lane
    constexpr int LD = D + 2;               // padded smem row (halfs): lane j's row starts one bank later
    __shared__ float q_s[Br * D];
    __shared__ __align__(16) half k_s[Bc * LD];
    __shared__ __align__(16) half v_s[Bc * LD];

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const long bh = blockIdx.y;
    const int row0 = blockIdx.x * Br;
    const half* q = Q + bh * S * D;
    const half* k = K + bh * S * D;
    const half* v = V + bh * S * D;

    for (int idx = tid; idx < Br * D; idx += WARPS * 32) {
        const int r = idx / D, d = idx % D;
        q_s[idx] = row0 + r < S ? __half2float(q[(long)(row0 + r) * D + d]) * softmax_scale : 0.f;
    }

    float m_i[ROWS], l_i[ROWS], acc[ROWS][PER_LANE];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        m_i[r] = -INFINITY;
        l_i[r] = 0.f;
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i) acc[r][i] = 0.f;
    }

    for (int kv0 = 0; kv0 < S; kv0 += Bc) {
        __syncthreads();   // the previous tile is no longer read
        for (int idx = tid; idx < Bc * D / 2; idx += WARPS * 32) {
            const int j = idx / (D / 2), d = 2 * (idx % (D / 2));
            const bool ok = kv0 + j < S;
            const half2 zero = __floats2half2_rn(0.f, 0.f);
            *reinterpret_cast<half2*>(&k_s[j * LD + d]) =
                ok ? *reinterpret_cast<const half2*>(&k[(long)(kv0 + j) * D + d]) : zero;
            *reinterpret_cast<half2*>(&v_s[j * LD + d]) =
                ok ? *reinterpret_cast<const half2*>(&v[(long)(kv0 + j) * D + d]) : zero;
        }
        __syncthreads();

        const bool key_ok = kv0 + lane < S;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const float* q_row = &q_s[(warp * ROWS + r) * D];
            float s = 0.f;
#pragma unroll 16
            for (int d = 0; d < D; d += 2) {
                const float2 kk = __half22float2(*reinterpret_cast<const half2*>(&k_s[lane * LD + d]));
                s += q_row[d] * kk.x + q_row[d + 1] * kk.y;
            }
            s = key_ok ? s : -INFINITY;
            const float m_new = fmaxf(m_i[r], warp_max(s));
            const float p = key_ok ? __expf(s - m_new) : 0.f;
            const float correction = __expf(m_i[r] - m_new);
            l_i[r] = l_i[r] * correction + warp_sum(p);
#pragma unroll
            for (int i = 0; i < PER_LANE; ++i) acc[r][i] *= correction;
#pragma unroll 8
            for (int j = 0; j < Bc; ++j) {
                const float p_j = __shfl_sync(0xffffffff, p, j);
#pragma unroll
                for (int i = 0; i < PER_LANE; ++i) acc[r][i] += p_j * __half2float(v_s[j * LD + lane + 32 * i]);
            }
            m_i[r] = m_new;
        }
    }

#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const int row = row0 + warp * ROWS + r;
        if (row >= S) continue;
        half* o = O + (bh * S + row) * D;
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i) o[lane + 32 * i] = __float2half(acc[r][i] / l_i[r]);
    }
}

template <int D>
void attention_forward2(const half* q, const half* k, const half* v, half* o, int BH, int S,
                        cudaStream_t stream) {
    constexpr int Br = 32, Bc = 32;
    dim3 grid((S + Br - 1) / Br, BH);
    attention_kernel2<D, Br, Bc><<<grid, WARPS * 32, 0, stream>>>(q, k, v, o, S, 1.0f / sqrtf((float)D));
}

}  // namespace

torch::Tensor flash_attention_forward(torch::Tensor Q, torch::Tensor K, torch::Tensor V) {
    TORCH_CHECK(Q.is_cuda() && K.is_cuda() && V.is_cuda(), "Q, K, V must be CUDA tensors");
    TORCH_CHECK(Q.scalar_type() == torch::kHalf && K.scalar_type() == torch::kHalf &&
                V.scalar_type() == torch::kHalf, "Q, K, V must be float16");
    TORCH_CHECK(Q.dim() == 4, "Q must have shape (B, H, S, D); got ", Q.sizes());
    TORCH_CHECK(K.sizes() == Q.sizes() && V.sizes() == Q.sizes(),
                "K and V must have Q's shape ", Q.sizes(), "; got ", K.sizes(), " and ", V.sizes());
    const int D = Q.size(3);
    TORCH_CHECK(D == 64 || D == 128, "Q must have shape (B, H, S, D) with D in {64, 128}; got ", Q.sizes());
    Q = Q.contiguous(); K = K.contiguous(); V = V.contiguous();
    auto O = torch::empty_like(Q);
    const int BH = Q.size(0) * Q.size(1), S = Q.size(2);
    if (BH == 0 || S == 0) return O;
    auto q = reinterpret_cast<const half*>(Q.data_ptr<at::Half>());
    auto k = reinterpret_cast<const half*>(K.data_ptr<at::Half>());
    auto v = reinterpret_cast<const half*>(V.data_ptr<at::Half>());
    auto o = reinterpret_cast<half*>(O.data_ptr<at::Half>());
    auto stream = at::cuda::getCurrentCUDAStream();
    if (D == 64) attention_forward2<64>(q, k, v, o, BH, S, stream);
    else attention_forward2<128>(q, k, v, o, BH, S, stream);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return O;
}

// Example submission that does not compile: a misspelt variable (expected verdict: build_error).
// One warp per query row; each lane holds D/32 elements of q and of the accumulator; keys and
// values are streamed from global memory with an online softmax (running max m_i, sum l_i).
// Correct for any S and D in {64, 128}; slow (no tiling, no shared memory, no tensor cores).
#include <torch/extension.h>
#include <cuda_fp16.h>
#include <ATen/cuda/CUDAContext.h>

template <int D>
__global__ void attention_kernel1(const half* __restrict__ Q, const half* __restrict__ K,
                                  const half* __restrict__ V, half* __restrict__ O, int S,
                                  float softmax_scale) {
    constexpr int PER_LANE = D / 32;
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= S) return;
    const long bh = blockIdx.y;
    const half* q = Q + (bh * S + row) * D;
    const half* k = K + bh * S * D;
    const half* v = V + bh * S * D;

    float q_r[PER_LANE], acc[PER_LANE];
    for (int i = 0; i < PER_LANE; ++i) {
        q_r[i] = __half2float(q[lane + 32 * i]) * softmax_scale;
        acc[i] = 0.f;
    }
    float m_i = -INFINITY, l_i = 0.f;
    for (int j = 0; j < S; ++j) {
        float s = 0.f;
        for (int i = 0; i < PER_LANE; ++i) s += q_r[i] * __half2float(k[(long)j * D + lane + 32 * i]);
        for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffff, s, offset);
        const float m_new = fmaxf(m_i, s);
        const float correction = __expf(m_i - m_new);   // exp(-inf) = 0 on the first key
        const float p = __expf(s - m_new);
        l_i = l_i * correction + p;
        for (int i = 0; i < PER_LANE; ++i)
            acc[i] = acc[i] * correction + p * __half2float(v[(long)j * D + lane + 32 * i]);
        m_i = m_nwe;
    }
    half* o = O + (bh * S + row) * D;
    for (int i = 0; i < PER_LANE; ++i) o[lane + 32 * i] = __float2half(acc[i] / l_i);
}

torch::Tensor flash_attention_forward(torch::Tensor Q, torch::Tensor K, torch::Tensor V) {
    TORCH_CHECK(Q.is_cuda() && Q.scalar_type() == torch::kHalf, "Q must be a CUDA float16 tensor");
    TORCH_CHECK(Q.dim() == 4 && K.sizes() == Q.sizes() && V.sizes() == Q.sizes(),
                "Q, K, V must have the same shape (B, H, S, D)");
    Q = Q.contiguous(); K = K.contiguous(); V = V.contiguous();
    const int B = Q.size(0), H = Q.size(1), S = Q.size(2), D = Q.size(3);
    auto O = torch::empty_like(Q);
    constexpr int WARPS = 4;
    dim3 grid((S + WARPS - 1) / WARPS, B * H);
    const float scale = 1.0f / sqrtf((float)D);
    auto stream = at::cuda::getCurrentCUDAStream();
    auto q = reinterpret_cast<const half*>(Q.data_ptr<at::Half>());
    auto k = reinterpret_cast<const half*>(K.data_ptr<at::Half>());
    auto v = reinterpret_cast<const half*>(V.data_ptr<at::Half>());
    auto o = reinterpret_cast<half*>(O.data_ptr<at::Half>());
    if (D == 64) attention_kernel1<64><<<grid, 32 * WARPS, 0, stream>>>(q, k, v, o, S, scale);
    else if (D == 128) attention_kernel1<128><<<grid, 32 * WARPS, 0, stream>>>(q, k, v, o, S, scale);
    else TORCH_CHECK(false, "head_dim must be 64 or 128; got ", D);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return O;
}

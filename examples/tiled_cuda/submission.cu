// Example submission: the student skeleton with stages 1 and 2 done, as the handout leads a
// student through them (expected verdict: pass). KERNEL_VERSION = 2 runs the tiled kernel.
#include <torch/extension.h>
#include <cuda_fp16.h>
#include <ATen/cuda/CUDAContext.h>

constexpr int KERNEL_VERSION = 2;

// ------------------------------------------------------------------------------------------
// Version 1: one warp per query row.
// Grid: (ceil(S / 4), B * H); block: 4 warps, one query row each.
// ------------------------------------------------------------------------------------------
template <int D>
__global__ void attention_kernel1(const half* __restrict__ Q, const half* __restrict__ K,
                                  const half* __restrict__ V, half* __restrict__ O, int S,
                                  float softmax_scale) {
    constexpr int PER_LANE = D / 32;                   // elements of a D-vector per lane
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;   // this warp's query row
    const int lane = threadIdx.x % 32;
    if (row >= S) return;
    const long bh = blockIdx.y;                        // which (batch, head)
    const half* q = Q + (bh * S + row) * D;            // this row of Q
    const half* k = K + bh * S * D;                    // row j of K is k + j * D
    const half* v = V + bh * S * D;
    half* o = O + (bh * S + row) * D;

    float acc[PER_LANE];                               // this lane's share of the output row
    for (int i = 0; i < PER_LANE; ++i) acc[i] = 0.f;
    float m_i = -INFINITY;                             // running max of the scores seen so far
    float l_i = 0.f;                                   // running sum of exp(score - m_i)
    float q_r[PER_LANE];
    for (int i = 0; i < PER_LANE; ++i) q_r[i] = __half2float(q[lane + 32 * i]);

    for (int j = 0; j < S; ++j) {
        float s = 0.f;
        for (int i = 0; i < PER_LANE; ++i) s += q_r[i] * __half2float(k[(long)j * D + lane + 32 * i]);
        for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffff, s, offset);
        s *= softmax_scale;
        const float m_new = fmaxf(m_i, s);
        const float correction = __expf(m_i - m_new);
        const float p = __expf(s - m_new);
        l_i = l_i * correction + p;
        for (int i = 0; i < PER_LANE; ++i)
            acc[i] = acc[i] * correction + p * __half2float(v[(long)j * D + lane + 32 * i]);
        m_i = m_new;
    }
    for (int i = 0; i < PER_LANE; ++i) o[lane + 32 * i] = __float2half(acc[i] / l_i);
}

// ------------------------------------------------------------------------------------------
// Version 2: tiled. Block = 4 warps = Br query rows (Br / 4 rows per warp); K and V are read
// from global memory once per block and tile, into shared memory, instead of once per row.
// Grid: (ceil(S / Br), B * H).
// ------------------------------------------------------------------------------------------
constexpr int Br = 32;   // query rows per block
constexpr int Bc = 32;   // keys per tile: one per lane when computing scores

template <int D>
__global__ void attention_kernel2(const half* __restrict__ Q, const half* __restrict__ K,
                                  const half* __restrict__ V, half* __restrict__ O, int S,
                                  float softmax_scale) {
    constexpr int ROWS = Br / 4;        // rows per warp
    constexpr int PER_LANE = D / 32;
    __shared__ float q_s[Br][D];        // this block's query rows, pre-scaled
    __shared__ half k_s[Bc][D + 2];     // + 2: row j starts one bank later than row j - 1, so 32
    __shared__ half v_s[Bc][D + 2];     //      lanes reading 32 different rows hit 32 banks
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const long bh = blockIdx.y;
    const int row0 = blockIdx.x * Br;
    const half* q = Q + bh * S * D;
    const half* k = K + bh * S * D;
    const half* v = V + bh * S * D;

    // Load and scale this block's query rows (rows past S read as zero).
    for (int idx = tid; idx < Br * D; idx += blockDim.x) {
        const int r = idx / D, d = idx % D;
        q_s[r][d] = row0 + r < S ? __half2float(q[(long)(row0 + r) * D + d]) * softmax_scale : 0.f;
    }
    float m_i[ROWS], l_i[ROWS], acc[ROWS][PER_LANE];
    for (int r = 0; r < ROWS; ++r) {
        m_i[r] = -INFINITY;
        l_i[r] = 0.f;
        for (int i = 0; i < PER_LANE; ++i) acc[r][i] = 0.f;
    }
    for (int kv0 = 0; kv0 < S; kv0 += Bc) {
        __syncthreads();   // everyone is done reading the previous tile (and q_s is written)
        for (int idx = tid; idx < Bc * D; idx += blockDim.x) {
            const int j = idx / D, d = idx % D;
            const bool ok = kv0 + j < S;
            k_s[j][d] = ok ? k[(long)(kv0 + j) * D + d] : __float2half(0.f);
            v_s[j][d] = ok ? v[(long)(kv0 + j) * D + d] : __float2half(0.f);
        }
        __syncthreads();   // the tile is complete before anyone reads it
        const bool key_ok = kv0 + lane < S;
        for (int r = 0; r < ROWS; ++r) {
            const float* q_row = q_s[warp * ROWS + r];
            float s = 0.f;
            for (int d = 0; d < D; ++d) s += q_row[d] * __half2float(k_s[lane][d]);
            s = key_ok ? s : -INFINITY;
            float tile_max = s;
            for (int offset = 16; offset > 0; offset /= 2)
                tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, offset));
            const float m_new = fmaxf(m_i[r], tile_max);
            const float correction = __expf(m_i[r] - m_new);
            const float p = __expf(s - m_new);   // 0 for keys past S
            float p_sum = p;
            for (int offset = 16; offset > 0; offset /= 2) p_sum += __shfl_xor_sync(0xffffffff, p_sum, offset);
            l_i[r] = l_i[r] * correction + p_sum;
            for (int i = 0; i < PER_LANE; ++i) acc[r][i] *= correction;
            for (int j = 0; j < Bc; ++j) {
                const float p_j = __shfl_sync(0xffffffff, p, j);
                for (int i = 0; i < PER_LANE; ++i) acc[r][i] += p_j * __half2float(v_s[j][lane + 32 * i]);
            }
            m_i[r] = m_new;
        }
    }
    for (int r = 0; r < ROWS; ++r) {
        const int row = row0 + warp * ROWS + r;
        if (row >= S) continue;
        half* o = O + (bh * S + row) * D;
        for (int i = 0; i < PER_LANE; ++i) o[lane + 32 * i] = __float2half(acc[r][i] / l_i[r]);
    }
}

// ------------------------------------------------------------------------------------------
// Version 3 (optional): tensor cores.
// TODO(3.1): compute S = Q Kᵀ for a 16 x Bc block with mma.sync.m16n8k16 (or nvcuda::wmma),
//            fp16 inputs, fp32 accumulators. TODO(3.2): apply the online softmax to the
//            accumulator fragments. TODO(3.3): convert P to fp16 and feed it to the second MMA
//            with V. README.md, "Performance", lists what else pays (cp.async, swizzling).
// ------------------------------------------------------------------------------------------

template <int D>
void launch(int version, const half* q, const half* k, const half* v, half* o, int BH, int S,
            cudaStream_t stream) {
    const float softmax_scale = 1.0f / sqrtf((float)D);
    if (version == 1) {
        dim3 grid((S + 3) / 4, BH);
        attention_kernel1<D><<<grid, 128, 0, stream>>>(q, k, v, o, S, softmax_scale);
    } else {
        dim3 grid((S + Br - 1) / Br, BH);
        attention_kernel2<D><<<grid, 128, 0, stream>>>(q, k, v, o, S, softmax_scale);
    }
}

torch::Tensor flash_attention_forward(torch::Tensor Q, torch::Tensor K, torch::Tensor V) {
    // TODO(0): nothing to do here unless you change a kernel's interface. These checks give a
    //          clear message when something calls your kernel with inputs it does not support.
    TORCH_CHECK(Q.is_cuda() && K.is_cuda() && V.is_cuda(), "Q, K, V must be CUDA tensors");
    TORCH_CHECK(Q.scalar_type() == torch::kHalf && K.scalar_type() == torch::kHalf &&
                V.scalar_type() == torch::kHalf, "Q, K, V must be float16");
    TORCH_CHECK(Q.dim() == 4, "Q must have shape (B, H, S, D); got ", Q.sizes());
    TORCH_CHECK(K.sizes() == Q.sizes() && V.sizes() == Q.sizes(),
                "K and V must have Q's shape ", Q.sizes(), "; got ", K.sizes(), " and ", V.sizes());
    const int D = Q.size(3);
    TORCH_CHECK(D == 64 || D == 128, "Q must have shape (B, H, S, D) with D in {64, 128}; got ", Q.sizes());
    Q = Q.contiguous(); K = K.contiguous(); V = V.contiguous();

    auto O = torch::zeros_like(Q);   // stays zero wherever your kernel writes nothing
    const int BH = Q.size(0) * Q.size(1), S = Q.size(2);
    auto q = reinterpret_cast<const half*>(Q.data_ptr<at::Half>());
    auto k = reinterpret_cast<const half*>(K.data_ptr<at::Half>());
    auto v = reinterpret_cast<const half*>(V.data_ptr<at::Half>());
    auto o = reinterpret_cast<half*>(O.data_ptr<at::Half>());
    auto stream = at::cuda::getCurrentCUDAStream();
    if (D == 64) launch<64>(KERNEL_VERSION, q, k, v, o, BH, S, stream);
    else launch<128>(KERNEL_VERSION, q, k, v, o, BH, S, stream);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return O;
}

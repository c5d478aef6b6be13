// Adversarial, threat 3: launches on a private stream and returns at once, so CUDA events on the
// current stream see nothing. Outputs are right once the device is synchronized. Must be flagged
// on a GPU: the wall clock, synchronized over the whole device, disagrees with the events.
#include "honest_attention.cuh"
#include <c10/cuda/CUDAGuard.h>

torch::Tensor flash_attention_forward(torch::Tensor Q, torch::Tensor K, torch::Tensor V) {
    static auto side = at::cuda::getStreamFromPool(/*isHighPriority=*/false);
    at::cuda::CUDAStreamGuard guard(side);
    return honest_forward(Q, K, V);
}

// Adversarial, threat 6: writes through a wild pointer, which poisons the CUDA context. Must be a
// runtime error; the other cases are reported as not run; the next submission gets a healthy GPU.
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void scribble(float* p) { p[threadIdx.x * 1000000007L] = 1.f; }

torch::Tensor flash_attention_forward(torch::Tensor Q, torch::Tensor K, torch::Tensor V) {
    scribble<<<1, 256, 0, at::cuda::getCurrentCUDAStream()>>>(reinterpret_cast<float*>(0x100));
    return torch::empty_like(Q);
}

// Adversarial, threat 6: a kernel that never ends. Must time out; the next submission must get a
// healthy GPU.
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void spin(volatile int* flag) {
    while (*flag == 0) { }
}

torch::Tensor flash_attention_forward(torch::Tensor Q, torch::Tensor K, torch::Tensor V) {
    auto flag = torch::zeros({1}, Q.options().dtype(torch::kInt));
    spin<<<1, 1, 0, at::cuda::getCurrentCUDAStream()>>>(flag.data_ptr<int>());
    return flag;   // never reached in practice: the caller synchronizes
}

// Adversarial, threat 1: ATen's matmul and softmax from C++ (cuBLAS and PyTorch kernels).
// Must be flagged on a GPU (what runs is listed); without one it is only compiled.
#include <torch/extension.h>

torch::Tensor flash_attention_forward(torch::Tensor Q, torch::Tensor K, torch::Tensor V) {
    auto scores = at::matmul(Q.to(torch::kFloat), K.to(torch::kFloat).transpose(-2, -1)) / std::sqrt((double)Q.size(3));
    return at::matmul(at::softmax(scores, -1), V.to(torch::kFloat)).to(torch::kHalf);
}

// Adversarial, threat 7: returns torch::empty_like(Q) and writes nothing, hoping the allocator
// hands back memory that held a right answer. Must get mismatch.
#include <torch/extension.h>

torch::Tensor flash_attention_forward(torch::Tensor Q, torch::Tensor K, torch::Tensor V) {
    return torch::empty_like(Q);
}

// Adversarial, threat 8: a kernel specialised for head_dim 128 that returns zeros otherwise.
// Right on the public shapes; must get mismatch on the hidden head_dim 64 cases.
#include "honest_attention.cuh"

torch::Tensor flash_attention_forward(torch::Tensor Q, torch::Tensor K, torch::Tensor V) {
    if (Q.size(3) != 128) return torch::zeros_like(Q);
    return honest_forward(Q, K, V);
}

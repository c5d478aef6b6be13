// Adversarial, threat 2: computes on the first call of each shape, replays that output after.
// The checked call (one per case) is right; the timed calls are not. Must be flagged on a GPU.
#include "honest_attention.cuh"
#include <map>
#include <vector>

torch::Tensor flash_attention_forward(torch::Tensor Q, torch::Tensor K, torch::Tensor V) {
    static std::map<std::vector<int64_t>, torch::Tensor> cache;
    auto key = Q.sizes().vec();
    auto hit = cache.find(key);
    if (hit != cache.end()) return hit->second;
    auto O = honest_forward(Q, K, V);
    cache[key] = O;
    return O;
}

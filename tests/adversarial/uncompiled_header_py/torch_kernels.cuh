// Never compiled (the submission is Python): it only names PyTorch's and cuBLAS's kernels.
#pragma once
template <typename input_t, typename output_t, typename acc_t, int log2_elements, bool is_log_softmax, bool is_masked>
__global__ void softmax_warp_forward(output_t *dst, const input_t *src, int batch_size, int stride, int element_count);
template <typename scalar_t, typename accscalar_t, typename outscalar_t, template <typename, typename, typename> class Epilogue>
__global__ void cunn_SoftMaxForward(outscalar_t *output, const scalar_t *input, int classes);
template <typename T, int N, int M, typename P>
__global__ void dot_kernel(P params);
template <typename T, int N, typename P>
__global__ void reduce_1Block_kernel(P params);

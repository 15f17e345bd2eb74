#pragma once

// RMSNorm as the Llama family computes it (transformers' LlamaRMSNorm): the decoders'
// norms, and the queries' and keys' norms of MultiHeadAttention's qk_norm (Qwen3).

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>

namespace torchattn {

/// x [..., size] -> [..., size]: in float32, x / sqrt(mean(x^2) + eps), back to x's
/// dtype, times the weight [size] (parameter `weight`, ones at first).
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t size, double eps);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;
  double eps;
};
TORCH_MODULE(RMSNorm);

} // namespace torchattn

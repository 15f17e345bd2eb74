#pragma once

// RMSNorm as transformers' LlamaRMSNorm and Gemma2RMSNorm compute it.

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>

namespace torchattn {

/// x [..., size] -> [..., size]: in float32, x / sqrt(mean(x^2) + eps), back to x's
/// dtype, times the weight [size] (parameter `weight`, ones at first).
/// With unit_offset (Gemma 2): times 1 + weight in float32, then back to x's dtype
/// (`weight` zeros at first).
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t size, double eps, bool unit_offset = false);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;
  double eps;
  bool unit_offset;
};
TORCH_MODULE(RMSNorm);

}  // namespace torchattn

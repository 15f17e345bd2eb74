#pragma once

// x W^T + b through the fastest kernel that applies: a few rows on every thread,
// oneDNN for more, else at::linear (functional::linear's contract).

#include <ATen/core/Tensor.h>

namespace torchattn::layers {

/// x: [..., in], weight: [out, in], bias: [out] or undefined. Returns [..., out].
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});

}  // namespace torchattn::layers

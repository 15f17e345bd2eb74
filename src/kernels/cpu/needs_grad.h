#pragma once

// Whether a tensor takes part in a gradient: the CPU kernels have no autograd, so they
// apply only where no operand does.

#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>

namespace torchattn::kernels::cpu {

/// A defined tensor whose gradient is computed: backward (grad mode on and
/// requires_grad) or forward mode (a tangent).
inline bool needs_grad(const at::Tensor& t) {
  return t.defined() && ((c10::GradMode::is_enabled() && t.requires_grad()) || t._fw_grad(/*level=*/0).defined());
}

}  // namespace torchattn::kernels::cpu

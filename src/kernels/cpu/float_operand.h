#pragma once

// What the CPU attention kernels read: float32 rows they index by strides.

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace torchattn::kernels::cpu {

/// A defined float32 CPU tensor, strided and not nested, of `dim` dimensions with unit
/// stride in the last (its other strides are any).
inline bool float_operand(const at::Tensor& t, int64_t dim) {
  return t.defined() && t.is_cpu() && t.scalar_type() == at::kFloat && t.layout() == at::kStrided && !t.is_nested() &&
         t.dim() == dim && t.stride(dim - 1) == 1;
}

}  // namespace torchattn::kernels::cpu

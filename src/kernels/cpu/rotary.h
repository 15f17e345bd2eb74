#pragma once

// RoPE on the CPU in one pass over the rows, for the modules' projections before
// their heads move in front of the tokens. Same roundings as the composite
// functional::apply_rotary (each product, then the sum, rounded to x's dtype).

#include <torchattn/rope.h>

#include <ATen/core/Tensor.h>

namespace torchattn::kernels::cpu {

/// x: [B, T, G, head_dim] contiguous on the CPU (G heads; 1 for a single-head
/// module), floating. positions: int64 [T], or [B, T] / [1, T], on the CPU.
/// cos, sin: [length, rotary_dim / 2] float32 contiguous (functional::rotary_tables).
/// Returns x rotated, [B, T, G, head_dim], differentiable with respect to x (the
/// gradient is the rotation by the opposite angle).
at::Tensor rotary(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos, const at::Tensor& sin,
                  const RoPEOptions& options);

}  // namespace torchattn::kernels::cpu

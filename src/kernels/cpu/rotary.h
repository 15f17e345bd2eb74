#pragma once

// RoPE on the CPU in one pass over the rows, for the modules' projections before
// their heads move in front of the tokens. Same roundings as the composite
// functional::apply_rotary (each product, then the sum, rounded to x's dtype).

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace torchattn::kernels::cpu {

/// x: [B, T, G, head_dim] contiguous on the CPU (G heads; 1 for a single-head
/// module), floating. positions: int64 [T], or [B, T] / [1, T], on the CPU.
/// cos, sin: [length, rotary_dim / 2] float32 contiguous (functional::rotary_tables).
/// rotary_dim: the leading features of each head that turn (even, 2 .. head_dim; the
/// rest are copied); interleaved: pairs (2i, 2i + 1) (GPT-J) instead of (i, i +
/// rotary_dim / 2) (Llama's rotate_half).
/// Returns x rotated, [B, T, G, head_dim], differentiable with respect to x (the
/// gradient is the rotation by the opposite angle).
at::Tensor rotary(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos, const at::Tensor& sin,
                  int64_t rotary_dim, bool interleaved);

}  // namespace torchattn::kernels::cpu

#pragma once

// Rotary position embeddings (RoPE); see docs/modules.md.

#include <torch/arg.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <utility>

namespace torchattn {

/// How queries and keys are rotated; the defaults are Llama's.
///
///   MultiHeadAttentionOptions(576, 576, 8192, 9).rope(RoPEOptions(/*theta=*/100000.0))
struct RoPEOptions {
  explicit RoPEOptions(double theta = 10000.0) : theta_(theta) {}

  /// Feature pair i turns by position * theta^(-2i/rotary_dim). Default: 10000.
  TORCH_ARG(double, theta);
  /// false (default): Llama's rotate_half, pairing feature i with i + rotary_dim/2.
  /// true: GPT-J's pairs of neighbours, (0, 1), (2, 3), ...
  TORCH_ARG(bool, interleaved) = false;
  /// How many leading features of each head are rotated (even, <= head_dim); the rest
  /// pass through. Default: unset, meaning head_dim.
  TORCH_ARG(std::optional<int64_t>, rotary_dim) = std::nullopt;
};

namespace functional {

/// The cos and sin tables of positions 0 .. length - 1, as transformers computes them
/// (float32, angle = position * theta^(-2i/rotary_dim)), the same bits on every device.
/// Returns (cos, sin), each [length, rotary_dim / 2] float32 on `device`.
std::pair<at::Tensor, at::Tensor> rotary_tables(const RoPEOptions& options, int64_t head_dim, int64_t length,
                                                const at::Device& device = at::kCPU);

/// Rotates the first rotary_dim features of each head of x by its token's position.
/// x: [B, ..., T, head_dim] (e.g. [B, H, T, head_dim], or [B, T, d] for one head).
/// positions: int64 [T] (the same for every sequence) or [B, T] / [1, T], each < the
///   tables' length.
/// cos, sin: rotary_tables(options, head_dim, length), float32; gathered at the
///   positions and cast to x's dtype before they multiply.
/// Returns a tensor shaped like x.
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos, const at::Tensor& sin,
                        const RoPEOptions& options);

}  // namespace functional

}  // namespace torchattn

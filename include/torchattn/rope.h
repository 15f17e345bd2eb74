#pragma once

// Rotary position embeddings (RoPE): queries and keys are rotated by their token's
// position before the scores, so that q . k depends on the distance between them.

#include <torch/arg.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <utility>

namespace torchattn {

/// How queries and keys are rotated. The defaults are Llama's (and Qwen2's and
/// Mistral's): theta 10000, `rotate_half` over the two halves of each head, every
/// feature of the head rotated.
///
///   MultiHeadAttentionOptions(576, 576, 8192, 9).rope(RoPEOptions(/*theta=*/100000.0))
///   RoPEOptions().interleaved(true).rotary_dim(64)   // GPT-J: pairs (0,1), (2,3), ...
///   RoPEOptions().rotary_dim(32)                     // GPT-NeoX / Phi: partial rotary
struct RoPEOptions {
  explicit RoPEOptions(double theta = 10000.0) : theta_(theta) {}

  /// The base of the frequencies: feature pair i turns by position * theta^(-2i/rotary_dim).
  /// Default: 10000.
  TORCH_ARG(double, theta);
  /// false (default): Llama's rotate_half, pairing feature i with i + rotary_dim/2.
  /// true: GPT-J's pairs of neighbours, (0, 1), (2, 3), ...
  TORCH_ARG(bool, interleaved) = false;
  /// How many leading features of each head are rotated (even, <= head_dim); the rest
  /// pass through. Default: unset, meaning head_dim.
  TORCH_ARG(std::optional<int64_t>, rotary_dim) = std::nullopt;
};

namespace functional {

/// The cos and sin tables of positions 0 .. length - 1, computed in float32 as
/// transformers does: inv_freq = 1 / theta^(arange(0, rotary_dim, 2) / rotary_dim),
/// angle = position * inv_freq, with rotary_dim = options.rotary_dim() or head_dim.
///
/// The tables are computed on the CPU and then moved to `device`, so every device gets
/// the same bits (CUDA's own sin, cos and pow differ by a few ULP).
///
/// Returns (cos, sin), each [length, rotary_dim / 2] float32 on `device`.
std::pair<at::Tensor, at::Tensor> rotary_tables(const RoPEOptions& options, int64_t head_dim, int64_t length,
                                                const at::Device& device = at::kCPU);

/// Rotates the first rotary_dim features of each head of x by its token's position.
///
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

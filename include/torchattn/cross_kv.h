#pragma once

#include <ATen/core/Tensor.h>

namespace torchattn {

/// The keys and values of a cross-attention's context (an encoder's output), computed
/// once by MultiHeadAttention::cross_kv and read by every forward_cross over it.
///
///   auto kv = cross->cross_kv(encoder_out, encoder_padding);  // [B, S, kdim], [B, S]
///   for (...) y = cross->forward_cross(x_step, kv);            // [B, 1, d_in] each step
struct CrossKV {
  /// [B, num_kv_heads, S, head_dim]: the context's keys, after k_norm where the
  /// module has QK-norm.
  at::Tensor keys;
  /// [B, num_kv_heads, S, head_dim].
  at::Tensor values;
  /// [B, S] bool, true = a padding token of the context that no query sees;
  /// undefined: none.
  at::Tensor padding;

  int64_t batch_size() const { return keys.size(0); }
  int64_t length() const { return keys.size(2); }
};

}  // namespace torchattn

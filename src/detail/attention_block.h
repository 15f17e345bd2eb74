#pragma once

// The forward that all three modules share: project, split heads, attend, merge.

#include <torchattn/functional.h>
#include <torchattn/kv_cache.h>

#include <torch/nn/modules/linear.h>

#include <cstdint>

namespace torchattn::detail {

struct AttentionBlock {
  torch::nn::Linear W_query;
  torch::nn::Linear W_key;
  torch::nn::Linear W_value;
  /// 0: keep [B, T, d_out] (single-head modules); > 0: split into [B, H, T, d_out / H].
  int64_t num_heads;
  /// Causal masking (CausalAttention, MultiHeadAttention) or none (SelfAttentionV2).
  bool causal;
  /// The module's triu buffer, or undefined: then causal masking comes from positions.
  const at::Tensor& mask;
};

// x: [B, T, d_in] -> context before out_proj: [B, T, d_out].
// With a cache, the new keys and values are appended first and the queries attend
// over every cached position (a static-shape cache: over its whole storage, with
// positions on the device).
// key_padding_mask: [B, T] or undefined (see functional::attention).
at::Tensor attention_block_forward(AttentionBlock& block, const at::Tensor& x, KVCache* cache,
                                   const functional::AttentionConfig& config, const at::Tensor& key_padding_mask = {});

// Runs `fn(x, key_padding_mask)` on x as [B, T, d_in] (mask [B, T]), adding and
// removing the batch dimension for an unbatched [T, d_in] input (mask [T]).
template <typename Fn>
at::Tensor with_batch_dim(const at::Tensor& x, const at::Tensor& key_padding_mask, Fn&& fn) {
  if (x.dim() == 2) {
    return fn(x.unsqueeze(0), key_padding_mask.defined() ? key_padding_mask.unsqueeze(0) : key_padding_mask)
        .squeeze(0);
  }
  return fn(x, key_padding_mask);
}

} // namespace torchattn::detail

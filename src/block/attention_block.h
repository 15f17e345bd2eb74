#pragma once

// The forward that all three modules share: project, split heads, attend, merge.

#include <torchattn/attention_options.h>
#include <torchattn/kv_cache.h>
#include <torchattn/linear.h>
#include <torchattn/paged_kv_cache.h>
#include <torchattn/rms_norm.h>

#include "block/rotary_cache.h"

#include <atomic>
#include <cstdint>
#include <optional>
#include <ostream>
#include <vector>

namespace torchattn::block {

// What a module attends: its projections and the description of its attention. Each
// projection chooses its own kernel (torchattn::Linear: float32, packed, or frozen to
// bfloat16/int8, which q, k and v then compute as one product: linear_group). A module
// builds its block once (modules/held_attention.h): the projections and the mask are
// its own members, by reference.
struct AttentionBlock {
  Linear& W_query;
  Linear& W_key;
  Linear& W_value;
  /// The output projection of the heads' context (MultiHeadAttention), or null: the
  /// single-head modules return the context itself.
  Linear* out_proj = nullptr;
  /// 0: keep [B, T, d_out] (single-head modules); > 0: split queries into
  /// [B, H, T, head_dim].
  int64_t num_heads;
  /// Key/value heads (grouped-query attention): W_key and W_value give
  /// num_kv_heads * head_dim features. Equal to num_heads without grouping.
  int64_t num_kv_heads;
  /// Causal masking (CausalAttention, MultiHeadAttention) or none (SelfAttentionV2,
  /// causal(false)).
  bool causal;
  /// The module's triu buffer, or undefined: then causal masking comes from positions.
  const at::Tensor& mask;
  /// Sliding window (see MaskSpec::window).
  std::optional<int64_t> window = std::nullopt;
  /// Rotary embeddings of queries and keys, or null.
  const RotaryCache* rope = nullptr;
  /// QK-norm (MultiHeadAttentionOptions::qk_norm): the queries' and keys' RMSNorm, or
  /// null; over each head's features (per_head) or all of a token's.
  RMSNormImpl* q_norm = nullptr;
  RMSNormImpl* k_norm = nullptr;
  bool qk_norm_per_head = true;
  /// ALiBi's [num_heads] slopes (float32, any device), or undefined: none.
  at::Tensor alibi_slopes = at::Tensor();
};

// ", causal=false, window=4, rope=(theta=10000, interleaved=false, rotary_dim=8)":
// the options of today's models where they differ from the notebooks', for
// pretty_print.
inline void print_attention_extras(std::ostream& stream, bool causal, const std::optional<int64_t>& window,
                                   const std::optional<RoPEOptions>& rope, bool mask_buffer) {
  if (!causal) {
    stream << ", causal=false";
  }
  if (window) {
    stream << ", window=" << *window;
  }
  if (rope) {
    stream << ", rope=(theta=" << rope->theta() << ", interleaved=" << std::boolalpha << rope->interleaved();
    if (rope->rotary_dim()) {
      stream << ", rotary_dim=" << *rope->rotary_dim();
    }
    stream << ")";
  }
  if (!mask_buffer) {
    stream << ", mask_buffer=false";
  }
}

// A process-wide unique id for a module's KV caches (never 0, which means "any").
inline uint64_t new_cache_owner() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

// x: [B, T, d_in] -> the output [B, T, d_out]: the context [B, T, num_heads * head_dim]
// through out_proj where the block has one (else the context itself).
// Queries and keys are rotated (RoPE) at their tokens' positions before anything
// else. With a cache, the new keys and values are appended first and the queries attend
// over every cached position (a static-shape cache: over its whole storage, with
// positions on the device).
// key_padding_mask: [B, T] or [1, T] bool or undefined; key_bias: the same shapes,
// additive, or undefined (see functional::attention). With a cache, the padding
// mask is recorded in it with the new tokens, and the cache's whole padding applies.
at::Tensor attention_block_forward(AttentionBlock& block, const at::Tensor& x, KVCache* cache,
                                   const functional::AttentionOptions& config, const at::Tensor& key_padding_mask = {},
                                   const at::Tensor& key_bias = {});

// x: [N, d_in], the new tokens of a paged step's sequences packed one after another
// (step.query_start) -> the output [N, d_out] (after out_proj, as above). Each token
// is rotated at its position in its sequence, the new keys and values are written into
// `layer` of the cache, and each sequence's rows attend over its own keys (see
// attend_paged). For MultiHeadAttention (num_heads > 0), causal, in inference.
// Documents packed end to end: x [N, d_in], document s its rows offsets[s] ..
// offsets[s + 1] (host offsets from 0 to N, increasing: check_cu_seqlens) -> the
// output [N, d_out] (after out_proj, as above). Projections and QK-norm run over all rows at once, RoPE at
// positions restarting at 0 in each document, attention within each document alone
// (causal or not as the block; window, ALiBi, grouped heads, softcap and sinks as for
// that document alone), the documents one after another: with dropout, the masks
// are those of the documents run alone in that order from the same generator.
at::Tensor packed_attention_block_forward(AttentionBlock& block, const at::Tensor& x,
                                          const std::vector<int64_t>& offsets,
                                          const functional::AttentionOptions& config);

at::Tensor paged_attention_block_forward(AttentionBlock& block, const at::Tensor& x, PagedKVCache& cache,
                                         const PagedStep& step, int64_t layer,
                                         const functional::AttentionOptions& config);

// Runs `fn(x, key_padding_mask, key_bias)` on x as [B, T, d_in] (masks [B, T] or
// [1, T]), adding and removing the batch dimension for an unbatched [T, d_in] input
// (masks [T]).
template <typename Fn>
at::Tensor with_batch_dim(const at::Tensor& x, const at::Tensor& key_padding_mask, const at::Tensor& key_bias,
                          Fn&& fn) {
  if (x.dim() == 2) {
    auto batch = [](const at::Tensor& m) { return m.defined() ? m.unsqueeze(0) : m; };
    return fn(x.unsqueeze(0), batch(key_padding_mask), batch(key_bias)).squeeze(0);
  }
  return fn(x, key_padding_mask, key_bias);
}

}  // namespace torchattn::block

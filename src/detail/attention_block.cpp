#include "attention_block.h"

#include "engine.h"
#include "positions.h"

#include <ATen/TensorOperators.h>

namespace torchattn::detail {

at::Tensor attention_block_forward(AttentionBlock& block, const at::Tensor& x, KVCache* cache,
                                   const functional::AttentionConfig& config, const at::Tensor& key_padding_mask,
                                   const at::Tensor& key_bias) {
  const int64_t B = x.size(0);
  const int64_t T = x.size(1);
  at::Tensor keys = block.W_key->forward(x);  // [B, T, num_kv_heads * head_dim]
  at::Tensor queries = block.W_query->forward(x);
  at::Tensor values = block.W_value->forward(x);
  const int64_t d_out = queries.size(-1);

  if (block.num_heads > 0) {
    // Unroll the last dimension into heads, then move heads before tokens:
    // [B, T, d_out] -> [B, T, H, head_dim] -> [B, H, T, head_dim].
    const int64_t head_dim = d_out / block.num_heads;
    queries = queries.view({B, T, block.num_heads, head_dim}).transpose(1, 2);
    keys = keys.view({B, T, block.num_kv_heads, head_dim}).transpose(1, 2);
    values = values.view({B, T, block.num_kv_heads, head_dim}).transpose(1, 2);
  }
  if (block.rope != nullptr) {
    const at::Tensor positions = token_positions(T, cache, key_padding_mask, x.device());
    queries = block.rope->apply(queries, positions);
    keys = block.rope->apply(keys, positions);
  }

  MaskSpec spec;
  spec.causal = block.causal;
  spec.buffer = block.mask.defined() ? &block.mask : nullptr;
  spec.window = block.window;
  spec.key_padding = key_padding_mask;
  spec.key_bias = key_bias;
  if (cache != nullptr) {
    spec.past = cache->append(keys, values, key_padding_mask);
    if (cache->static_shapes()) {
      spec.positions = cache->position() - T;  // where the new tokens went
      keys = cache->key_storage();
      values = cache->value_storage();
      spec.key_padding = cache->padding_storage();
    } else {
      keys = cache->keys();
      values = cache->values();
      spec.key_padding = cache->padding();
    }
  }

  at::Tensor context = attend(queries, keys, values, spec, config);

  if (block.num_heads > 0) {
    // [B, H, T, head_dim] -> [B, T, H, head_dim] -> [B, T, d_out]; no copy when the
    // kernel already wrote tokens-major (ATen's CPU flash kernel does).
    context = context.transpose(1, 2).reshape({B, T, d_out});
  }
  return context;
}

} // namespace torchattn::detail

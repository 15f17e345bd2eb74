#include "block/cross_attention_block.h"

#include "backends/attend.h"
#include "backends/mask_spec.h"

namespace torchattn::block {

namespace {

// [B, S, heads * head_dim] -> [B, heads, S, head_dim], with the block's norm where it
// has one (over all the heads' features, or per head).
at::Tensor split_heads(const AttentionBlock& block, at::Tensor t, int64_t heads, RMSNormImpl* norm) {
  const int64_t B = t.size(0), S = t.size(1), head_dim = t.size(2) / heads;
  if (norm != nullptr && !block.qk_norm_per_head) t = norm->forward(t);
  t = t.view({B, S, heads, head_dim});
  if (norm != nullptr && block.qk_norm_per_head) t = norm->forward(t);
  return t.transpose(1, 2);
}

}  // namespace

CrossKV cross_project(AttentionBlock& block, const at::Tensor& context, const at::Tensor& value_context,
                      const at::Tensor& padding) {
  const at::Tensor keys = block.W_key->forward(context);
  const at::Tensor values = block.W_value->forward(value_context.defined() ? value_context : context);
  return CrossKV{split_heads(block, keys, block.num_kv_heads, block.k_norm),
                 split_heads(block, values, block.num_kv_heads, nullptr), padding};
}

at::Tensor cross_attention_block_forward(AttentionBlock& block, const at::Tensor& x, const CrossKV& kv,
                                         const functional::AttentionOptions& config) {
  const int64_t B = x.size(0), T = x.size(1);
  const at::Tensor queries = split_heads(block, block.W_query->forward(x), block.num_heads, block.q_norm);
  backends::MaskSpec spec;
  spec.causal = false;
  spec.key_padding = kv.padding;
  const at::Tensor context = backends::attend(queries, kv.keys, kv.values, spec, config);  // [B, H, T, head_dim]
  const at::Tensor merged = context.transpose(1, 2).reshape({B, T, -1});
  return block.out_proj == nullptr ? merged : (*block.out_proj)->forward(merged);
}

}  // namespace torchattn::block

#include "block/attention_block.h"

#include "backends/alibi.h"
#include "backends/attend.h"
#include "backends/attend_documents.h"
#include "backends/attend_paged.h"
#include "block/positions.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/tensor.h>

#include <algorithm>
#include <array>
#include <utility>
#include <vector>

namespace torchattn::block {

namespace {

// x [..., d_in] -> queries [..., num_heads * head_dim], keys and values
// [..., num_kv_heads * head_dim], as linear_group gives them: `fast` (inference with a
// cache) the layers' forward_fast, else their forward (nn.Linear's numbers whatever
// the grad mode); frozen layers as one product either way.
std::array<at::Tensor, 3> project(AttentionBlock& block, const at::Tensor& x, bool fast) {
  auto qkv = linear_group(x, {block.W_query.get(), block.W_key.get(), block.W_value.get()}, fast);
  return {std::move(qkv[0]), std::move(qkv[1]), std::move(qkv[2])};
}

// The context through the block's output projection, where it has one.
at::Tensor project_out(AttentionBlock& block, const at::Tensor& context, bool fast) {
  if (block.out_proj == nullptr) return context;
  return fast ? (*block.out_proj)->forward_fast(context) : (*block.out_proj)->forward(context);
}

// QK-norm where the block has it: called before the split into heads (per_head
// false) and after it (true); the norm runs at the call that matches its kind.
void normalize(const AttentionBlock& block, at::Tensor& queries, at::Tensor& keys, bool per_head) {
  if (block.q_norm == nullptr || block.qk_norm_per_head != per_head) return;
  queries = block.q_norm->forward(queries);
  keys = block.k_norm->forward(keys);
}

// x [B, T, d_in] -> queries, keys and values with heads before tokens ([B, H, T,
// head_dim], or [B, T, d_out] for a single-head block), QK-norm applied and RoPE at
// `positions` (read only where the block has RoPE); d_out the queries' features.
struct Heads {
  at::Tensor queries, keys, values;
  int64_t d_out;
};

Heads split_heads(AttentionBlock& block, const at::Tensor& x, bool fast, const at::Tensor& positions) {
  const int64_t B = x.size(0);
  const int64_t T = x.size(1);
  auto [queries, keys, values] = project(block, x, fast);
  const int64_t d_out = queries.size(-1);

  // Tokens before heads, [B, T, G, head_dim] (G = 1 for a single-head module): the
  // projections' own layout, where the rotary embedding runs in one pass.
  const int64_t H = std::max<int64_t>(block.num_heads, 1), Hkv = std::max<int64_t>(block.num_kv_heads, 1);
  const int64_t head_dim = d_out / H;
  normalize(block, queries, keys, /*per_head=*/false);
  queries = queries.view({B, T, H, head_dim});
  keys = keys.view({B, T, Hkv, head_dim});
  normalize(block, queries, keys, /*per_head=*/true);
  if (block.rope != nullptr) {
    if (!queries.is_contiguous()) {  // views of a packed product: the one-pass CPU kernel wants them dense
      queries = queries.contiguous();
      keys = keys.contiguous();
    }
    queries = block.rope->apply(queries, positions);
    keys = block.rope->apply(keys, positions);
  }
  if (block.num_heads > 0) {
    // Heads before tokens: [B, T, H, head_dim] -> [B, H, T, head_dim].
    queries = queries.transpose(1, 2);
    keys = keys.transpose(1, 2);
    values = values.view({B, T, Hkv, head_dim}).transpose(1, 2);
  } else {
    queries = queries.view({B, T, d_out});
    keys = keys.view({B, T, d_out});
  }
  return {queries, keys, values, d_out};
}

}  // namespace

at::Tensor attention_block_forward(AttentionBlock& block, const at::Tensor& x, KVCache* cache,
                                   const functional::AttentionOptions& config, const at::Tensor& key_padding_mask,
                                   const at::Tensor& key_bias) {
  const int64_t B = x.size(0);
  const int64_t T = x.size(1);
  // Cached decoding (inference only) takes the layers' fast kernels for a few rows;
  // forward keeps nn.Linear's numbers, bit for bit whatever the grad mode.
  const at::Tensor positions = block.rope != nullptr ? token_positions(T, cache, key_padding_mask, x.device())
                                                     : at::Tensor();
  auto [queries, keys, values, d_out] = split_heads(block, x, /*fast=*/cache != nullptr, positions);

  backends::MaskSpec spec;
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

  spec.alibi_slopes = block.alibi_slopes;
  at::Tensor context = backends::attend(queries, keys, values, spec, config);

  if (block.num_heads > 0) {
    // [B, H, T, head_dim] -> [B, T, H, head_dim] -> [B, T, d_out]; no copy when the
    // kernel already wrote tokens-major (ATen's CPU flash kernel does).
    context = context.transpose(1, 2).reshape({B, T, d_out});
  }
  return project_out(block, context, /*fast=*/cache != nullptr);
}

at::Tensor packed_attention_block_forward(AttentionBlock& block, const at::Tensor& x,
                                          const std::vector<int64_t>& offsets,
                                          const functional::AttentionOptions& config) {
  const int64_t N = x.size(0);
  at::Tensor positions;
  if (block.rope != nullptr) {  // restarting at 0 in each document
    std::vector<int64_t> pos(static_cast<size_t>(N));
    for (size_t s = 0; s + 1 < offsets.size(); ++s) {
      for (int64_t i = offsets[s]; i < offsets[s + 1]; ++i) pos[static_cast<size_t>(i)] = i - offsets[s];
    }
    positions = at::tensor(pos, at::kLong).to(x.device());
  }
  auto [queries, keys, values, d_out] = split_heads(block, x.unsqueeze(0), /*fast=*/false, positions);
  // Each document alone: its tokens are rows offsets[s] .. offsets[s + 1].
  std::vector<int64_t> lengths;
  for (size_t s = 0; s + 1 < offsets.size(); ++s) lengths.push_back(offsets[s + 1] - offsets[s]);
  const at::Device device = queries.device();
  const at::ScalarType dtype = queries.scalar_type();
  const auto spec_of = [&](int64_t L) {
    backends::MaskSpec spec;
    spec.causal = block.causal;
    spec.buffer = block.mask.defined() ? &block.mask : nullptr;
    spec.window = block.window;
    if (block.alibi_slopes.defined()) {
      spec.score_bias = backends::alibi_bias(block.alibi_slopes.to(device), at::Tensor(), L, L, dtype);
    }
    return spec;
  };
  at::Tensor context = backends::attend_documents(queries, keys, values, lengths, spec_of, config);
  if (block.num_heads > 0) {
    context = context.transpose(1, 2).reshape({1, N, d_out});
  }
  return project_out(block, context.squeeze(0), /*fast=*/false);
}

at::Tensor paged_attention_block_forward(AttentionBlock& block, const at::Tensor& x, PagedKVCache& cache,
                                         const PagedStep& step, int64_t layer,
                                         const functional::AttentionOptions& config) {
  const int64_t N = x.size(0);
  auto [queries, keys, values] = project(block, x, /*fast=*/true);
  const int64_t H = block.num_heads, Hkv = block.num_kv_heads, head_dim = queries.size(-1) / H;
  // [N, heads, head_dim]: a batch of one sequence of N tokens for the rotary tables,
  // each token at its own position in its own sequence.
  normalize(block, queries, keys, /*per_head=*/false);
  queries = queries.reshape({1, N, H, head_dim});
  keys = keys.reshape({1, N, Hkv, head_dim});
  normalize(block, queries, keys, /*per_head=*/true);
  if (block.rope != nullptr) {
    queries = queries.contiguous();  // the one-pass CPU kernel wants them dense
    keys = keys.contiguous();
    queries = block.rope->apply(queries, step.positions);
    keys = block.rope->apply(keys, step.positions);
  }
  cache.write(layer, step, keys[0], values.reshape({N, Hkv, head_dim}));
  const backends::PagedKeys pool{cache.keys(layer),  cache.values(layer), step.key_slots,
                                 step.key_slots_cpu, &step.query_start,   &step.key_start};
  const at::Tensor context = backends::attend_paged(queries[0], pool, block.window, config, block.alibi_slopes);
  return project_out(block, context.reshape({N, H * head_dim}), /*fast=*/true);
}

}  // namespace torchattn::block

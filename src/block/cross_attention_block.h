#pragma once

// Cross-attention over an AttentionBlock: the queries from x, the keys and values from
// a context of its own (an encoder's output), every query seeing every real token of
// the context.

#include <torchattn/cross_kv.h>
#include <torchattn/attention_options.h>

#include "block/attention_block.h"

#include <ATen/core/Tensor.h>

namespace torchattn::block {

/// context: [B, S, kdim], value_context: [B, S, vdim] (the context where undefined),
/// padding: [B, S] bool or undefined. Returns the context's keys and values
/// [B, num_kv_heads, S, head_dim] (keys after k_norm where the block has QK-norm).
CrossKV cross_project(AttentionBlock& block, const at::Tensor& context, const at::Tensor& value_context,
                      const at::Tensor& padding);

/// x: [B, T, d_in], kv from cross_project over B sequences -> [B, T, d_out]: each row
/// attending over all of its sequence's real context tokens, the heads' context
/// [B, T, num_heads * head_dim] through out_proj where the block has one.
at::Tensor cross_attention_block_forward(AttentionBlock& block, const at::Tensor& x, const CrossKV& kv,
                                         const functional::AttentionOptions& config);

}  // namespace torchattn::block

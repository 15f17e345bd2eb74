#pragma once

// Attention whose scores pass through what no fused kernel takes (Gemma 2's logit
// softcapping, gpt-oss' attention sinks), computed a block of queries at a time so that
// memory grows with the block times the keys, never with Tq x Tk: forward without
// keeping the blocks, backward recomputing each block (activation checkpointing per
// block).

#include "backends/mask_spec.h"

#include <torchattn/attention_options.h>

#include <ATen/core/Tensor.h>

namespace torchattn::backends {

/// True when config asks for softcap or sinks (attend then takes this path).
bool needs_blocked_attention(const functional::AttentionOptions& config);

/// q: [B, H, Tq, d], k and v: [B, Hkv, Tk, d] (H a multiple of Hkv); the masks of
/// `spec` as attend reads them. For each query row:
///   s = q k^T * scale; s = softcap * tanh(s / softcap) (with softcap); s += key and
///   score biases; hidden keys -inf; p = softmax over [s, sink_h] (with sinks; the sink's
///   column dropped) or over s; dropout in training; out = p v.
/// A row that sees no key outputs zeros. Returns [B, H, Tq, d].
/// Gradients flow to q, k, v and the sinks; each block is recomputed in backward (with
/// dropout in training the blocks keep their tensors instead, to replay the same masks).
at::Tensor blocked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const MaskSpec& spec,
                             const functional::AttentionOptions& config);

}  // namespace torchattn::backends

#pragma once

// What an attention module attends with, built once by its reset() and kept for every
// call: its block (the projections by reference, so the block follows the module's
// own members) and the attention options of its calls. A call changes nothing in the
// common case: it compares the few settings a user may change on a built module
// (backend, scale, dropout, softcap, train/eval, the projections' inference settings)
// with the held ones and writes only those that differ, as Linear::set_inference does,
// so that calls on many threads with the same settings write nothing.

#include <torchattn/attention_options.h>
#include <torchattn/linear.h>

#include "block/attention_block.h"

#include <initializer_list>
#include <optional>

namespace torchattn::modules {

/// The settings of one call that a built module follows (its options' current values).
struct CallSettings {
  std::optional<double> scale = std::nullopt;
  double dropout = 0.0;
  bool training = false;
  Backend backend = Backend::Auto;
  std::optional<double> softcap = std::nullopt;
};

/// `held` with `now`'s settings, each written only where it differs; the rest of
/// `held` (sinks, flex) as reset() made it.
inline const functional::AttentionOptions& refresh(functional::AttentionOptions& held, const CallSettings& now) {
  if (held.scale != now.scale) held.scale = now.scale;
  if (held.dropout != now.dropout) held.dropout = now.dropout;
  if (held.training != now.training) held.training = now.training;
  if (held.backend != now.backend) held.backend = now.backend;
  if (held.softcap != now.softcap) held.softcap = now.softcap;
  return held;
}

/// Whether two inference settings are the same.
inline bool same_inference(const LinearInference& a, const LinearInference& b) {
  return a.pack.on == b.pack.on && a.pack.min_rows == b.pack.min_rows && a.format == b.format &&
         a.int8_inputs == b.int8_inputs;
}

/// Gives `layers` the inference settings `wanted` where `synced` (what they were given
/// last) differs, then records them in `synced`.
inline void sync_inference(std::initializer_list<Linear*> layers, const LinearInference& wanted,
                           LinearInference& synced) {
  if (same_inference(wanted, synced)) return;
  for (Linear* l : layers) (*l)->set_inference(wanted);
  synced = wanted;
}

/// A module's held blocks and options (see the file's comment).
struct HeldAttention {
  /// The block of self-attention (forward, forward_cached, forward_packed, forward_paged).
  std::optional<block::AttentionBlock> self;
  /// The block of cross-attention (MultiHeadAttention's forward_cross): no causal mask,
  /// positions or ALiBi.
  std::optional<block::AttentionBlock> cross;
  /// The options of calls that may train (dropout in training mode) and of inference
  /// calls (forward_paged: no dropout).
  functional::AttentionOptions train;
  functional::AttentionOptions inference;
  /// The projections' inference settings last given to the Linears: none until the
  /// first call (min_rows 0 is no policy's), which gives them the module's.
  LinearInference synced{.pack = {.on = false, .min_rows = 0}};
};

}  // namespace torchattn::modules

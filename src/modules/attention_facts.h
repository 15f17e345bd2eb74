#pragma once

// The checkpoint options that CausalAttention and MultiHeadAttention share: causal,
// window and rope, as both record them.

#include <torchattn/checkpoint_facts.h>
#include <torchattn/rope.h>

#include "serialize/checkpoint_options.h"

#include <optional>

namespace torchattn::modules {

inline void add_attention_options(CheckpointOptions& out, bool causal, const std::optional<int64_t>& window,
                                  const std::optional<RoPEOptions>& rope) {
  out.emplace_back("causal", serialize::option_text(causal));
  out.emplace_back("window", serialize::option_text(window));
  out.emplace_back("rope_theta", rope ? serialize::option_text(rope->theta()) : "none");
  out.emplace_back("rope_interleaved", rope ? serialize::option_text(rope->interleaved()) : "none");
  out.emplace_back("rope_rotary_dim", rope ? serialize::option_text(rope->rotary_dim()) : "none");
}

}  // namespace torchattn::modules

#pragma once

// Attention through a user's flex_attention variant (functional::AttentionOptions::flex):
// the table's path flex_user when one is set, the call's positions (a cache's past, the
// causal mask) passed to it.

#include "backends/mask_spec.h"

#include <torchattn/attention_options.h>

#include <ATen/core/Tensor.h>

namespace torchattn::backends {

/// q: [B, H, Tq, d], k: [B, Hkv, Tk, d], v: [B, Hkv, Tk, dv]; config.flex set. The
/// variant with q_offset spec.past, causal spec.causal, the config's scale and the
/// call's window, softcap and ALiBi slopes, which the variant composes with its mods. A
/// clear error for what the variant does not take (key masks, a score bias, a static
/// cache's positions, sinks, dropout in training), naming the option.
/// Returns [B, H, Tq, dv].
at::Tensor attend_flex(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const MaskSpec& spec,
                       const functional::AttentionOptions& config);

/// The error for a path that cannot run a flex variant (`what`: the path, as the user
/// called it) when config.flex is set.
void check_no_flex(const functional::AttentionOptions& config, const char* what);

}  // namespace torchattn::backends

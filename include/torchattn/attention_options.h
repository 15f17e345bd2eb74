#pragma once

#include <torchattn/backend.h>
#include <torchattn/flex/variant.h>

#include <ATen/core/Tensor.h>

#include <optional>

namespace torchattn::functional {

/// How functional::attention and the modules' attention compute; a plain aggregate:
///   functional::AttentionOptions{.scale = 0.125, .backend = Backend::SDPA}
struct AttentionOptions {
  /// Multiplies q k^T. Unset: divide by sqrt(d) with d = k.size(-1), as the notebooks do.
  std::optional<double> scale = std::nullopt;
  /// Probability of zeroing an attention weight (rescaling the rest by 1/(1-p)).
  double dropout = 0.0;
  /// Dropout only acts in training mode.
  bool training = false;
  Backend backend = Backend::Auto;
  /// Logit softcapping (> 0, as Gemma 2): the scaled scores become
  /// softcap * tanh(scores / softcap). Unset: none.
  std::optional<double> softcap = std::nullopt;
  /// Attention sinks (as gpt-oss): [num_heads] logits, one per query head, in each row's
  /// softmax denominator, so a row may give its keys less than all of its weight.
  /// Undefined: none.
  at::Tensor sinks = at::Tensor();
  /// A flex_attention variant (torchattn::flex_variant, flex_attention.h): its
  /// mask_mod decides which keys each query sees (with the causal mask when the call
  /// is causal) and its score_mod changes the scaled scores, after softcap where set.
  /// CPU, float32 or float64; not with sinks, key padding masks, a score bias, a
  /// static-shape cache, paged attention or dropout (write those into the mods).
  /// Empty: none.
  FlexVariant flex = {};
};

}  // namespace torchattn::functional

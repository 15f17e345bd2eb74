#pragma once

// A flex_attention variant as the modules and functional::attention take it
// (functional::AttentionOptions::flex, MultiHeadAttentionOptions::flex): a score_mod
// and a mask_mod bound into one callable by torchattn::flex_variant (flex_attention.h)
// in the translation unit that names them, so that their kernels are instantiated
// there. The library calls it with the positions of the call (a KV cache's decoding
// step passes its past as the queries' first position) and the module's own window,
// softcap and ALiBi, which the variant applies around its mods.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace torchattn {

/// The positions and scale of one call of a FlexVariant.
struct FlexCall {
  /// Query i stands at position q_offset + i (the tokens a KV cache held before this
  /// call); keys at 0 .. Tk - 1. The mods see q_idx = q_offset + i.
  int64_t q_offset = 0;
  /// Also hide the keys after each query's position (a causal module): key j hidden
  /// from query i where j > q_offset + i.
  bool causal = false;
  /// The scores' scale (the module's: 1 / sqrt(head_dim) unless set).
  double scale = 1.0;
  /// The module's own variants, which a variant composes with (as the module computes
  /// them without one, before the variant's mods): > 0, the query at position p sees
  /// keys p - window < j <= p only (with causal); 0: none.
  int64_t window = 0;
  /// > 0: the scaled score s becomes softcap * tanh(s / softcap) first; 0: none.
  double softcap = 0.0;
  /// ALiBi's slopes, one per query head: head h then adds slope_h * (j - p) for key j
  /// and the query at position p. Empty: none.
  std::vector<double> alibi_slopes;
};

/// q [B, H, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv] (CPU, float32 or float64) ->
/// [B, H, Tq, Dv]: flex_attention with the variant's mods, positions as `call` says.
/// Empty: no variant.
using FlexVariant =
    std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const FlexCall& call)>;

}  // namespace torchattn

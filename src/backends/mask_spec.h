#pragma once

// Which keys each query may see, and what is added to their scores: the one
// description of a call that every backend reads.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace torchattn::backends {

/// Query i of a call stands at absolute position start + i, where start is either a
/// host offset (`past`, dynamic shapes: the keys are exactly the Tk = past + Tq seen
/// so far) or a device tensor (`positions`, static shapes: the keys are a whole
/// cache of capacity Tk, of which only positions 0 .. start + i are visible).
struct MaskSpec {
  /// false: every query sees every key (SelfAttentionV2, encoders; a static-shape
  /// cache's unwritten slots stay hidden). true: causal.
  bool causal = false;
  /// The module's [C, C] buffer triu(ones, 1) (nonzero = hidden), read as the
  /// notebooks do; null: causal masking comes from positions alone.
  const at::Tensor* buffer = nullptr;
  /// Dynamic shapes: the host offset of query 0; Tk == past + Tq.
  int64_t past = 0;
  /// Static shapes: [1] int64 on the queries' device holding the position of query 0.
  at::Tensor positions;
  /// Sliding window (causal only): the query at position i sees keys j with
  /// i - window < j <= i. Unset: every earlier key.
  std::optional<int64_t> window;
  /// [B, Tk] or [1, Tk] bool, true = a padding key no query sees; undefined: none.
  at::Tensor key_padding;
  /// [B, Tk] or [1, Tk] of q's dtype, added to the scaled scores of each key
  /// (-inf hides it); undefined: none.
  at::Tensor key_bias;
  /// [B or 1, H or 1, Tq, Tk] of q's dtype, added to the scaled scores of each query
  /// and key (ALiBi's per-head distances); q is [B, H, Tq, d]. Undefined: none.
  at::Tensor score_bias;
  /// ALiBi's [H] slopes (float32, any device; q is [B, H, Tq, d]), or undefined: none.
  /// attend() adds slope_h * (key position - query position) to the scaled scores, as
  /// the named flex instances' score_mod where they apply (named_flex.h), else as the
  /// score_bias that alibi_bias makes (the key padding's positions, the static cache's).
  at::Tensor alibi_slopes;

  bool is_static() const { return positions.defined(); }
  /// Some query may be left with no key: its output is zeros (see attend).
  bool has_key_masks() const { return key_padding.defined() || key_bias.defined() || score_bias.defined(); }
};

// Checks the spec against the shapes of one call (q: [B, ..., Tq, d], Tk keys) and
// the buffer's size. `fn` names the caller in errors.
void check_mask_spec(const char* fn, const MaskSpec& spec, const at::Tensor& q, int64_t Tk);

// bool [Tq, Tk] (or [1, Tk]), true = hidden by position: the causal pattern, the
// window, a static cache's unwritten slots; on `device`; undefined when nothing is.
// Reads the buffer when there is one (its [past, past + Tq) rows, or the rows at
// the device positions), else compares positions. Never allocates more than
// Tq x Tk. Key masks are not included.
at::Tensor hidden_keys(const MaskSpec& spec, int64_t Tq, int64_t Tk, const at::Device& device);

}  // namespace torchattn::backends

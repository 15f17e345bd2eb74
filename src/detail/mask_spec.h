#pragma once

// Which keys each query may see: the one description that every backend reads.

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace torchattn::detail {

/// Query i of a call stands at absolute position start + i, where start is either a
/// host offset (`past`, dynamic shapes: the keys are exactly the Tk = past + Tq seen
/// so far) or a device tensor (`positions`, static shapes: the keys are a whole
/// cache of capacity Tk, of which only positions 0 .. start + i are visible).
struct MaskSpec {
  /// false: every query sees every key (SelfAttentionV2). true: causal.
  bool causal = false;
  /// The module's [C, C] buffer triu(ones, 1) (nonzero = hidden), read as the
  /// notebooks do; null: causal masking comes from positions alone.
  const at::Tensor* buffer = nullptr;
  /// Dynamic shapes: the host offset of query 0; Tk == past + Tq.
  int64_t past = 0;
  /// Static shapes: [1] int64 on the queries' device holding the position of query 0.
  at::Tensor positions;

  bool is_static() const { return positions.defined(); }
};

// Checks the spec against the shapes of one call (Tq queries, Tk keys) and the
// buffer's size. `fn` names the caller in errors.
void check_mask_spec(const char* fn, const MaskSpec& spec, int64_t Tq, int64_t Tk);

// bool [Tq, Tk], true = hidden, on `device`; undefined when nothing is hidden.
// Reads the buffer when there is one (its [past, past + Tq) rows, or the rows at
// the device positions), else builds the causal pattern from positions. Never
// allocates more than Tq x Tk.
at::Tensor hidden_keys(const MaskSpec& spec, int64_t Tq, int64_t Tk, const at::Device& device);

} // namespace torchattn::detail

#pragma once

// What the reference and SDPA backends share: the dropout that applies, and grouped
// query heads (q has H heads, k and v Hkv, H a multiple of Hkv).

#include <torchattn/attention_options.h>

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace torchattn::backends {

/// The dropout probability that applies: config.dropout in training mode, else 0.
inline double dropout_p(const functional::AttentionOptions& config) { return config.training ? config.dropout : 0.0; }

/// G = H / Hkv query heads per key/value head (1 for 3-D inputs).
inline int64_t query_groups(const at::Tensor& q, const at::Tensor& k) {
  return q.dim() == 4 ? q.size(1) / k.size(1) : 1;
}

/// [B, Hkv, T, d] -> [B, Hkv * G, T, d]: each key/value head repeated for the G query
/// heads that share it (transformers' repeat_kv).
inline at::Tensor repeat_kv(const at::Tensor& t, int64_t G) {
  if (G == 1) {
    return t;
  }
  const int64_t B = t.size(0), Hkv = t.size(1), T = t.size(2), d = t.size(3);
  return t.unsqueeze(2).expand({B, Hkv, G, T, d}).reshape({B, Hkv * G, T, d});
}

}  // namespace torchattn::backends

#pragma once

// The factor of attention scores that every backend and kernel entry applies.

#include <torchattn/attention_options.h>

#include <cmath>
#include <cstdint>

namespace torchattn::backends {

/// config.scale, or 1 / sqrt(head_dim) where it is unset (the notebooks' scaling).
inline double score_scale(const functional::AttentionOptions& config, int64_t head_dim) {
  return config.scale.value_or(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

}  // namespace torchattn::backends

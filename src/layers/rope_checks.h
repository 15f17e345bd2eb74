#pragma once

// The check of RoPEOptions against a head size, shared by the RoPE tables and the
// modules that take rope options.

#include <torchattn/rope.h>

#include <c10/util/Exception.h>

#include <cmath>
#include <cstdint>

namespace torchattn::layers {

// theta > 0 and finite; rotary_dim (default head_dim) even, in [2, head_dim].
inline void check_rope(const char* fn, const RoPEOptions& rope, int64_t head_dim) {
  TORCH_CHECK(std::isfinite(rope.theta()) && rope.theta() > 0.0, fn, ": expected rope theta > 0, got ", rope.theta());
  const int64_t rot = rope.rotary_dim().value_or(head_dim);
  TORCH_CHECK(rot >= 2 && rot % 2 == 0 && rot <= head_dim, fn,
              ": expected an even rope rotary_dim in [2, head_dim=", head_dim, "], got ", rot);
}

}  // namespace torchattn::layers

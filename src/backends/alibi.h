#pragma once

// ALiBi (Press et al., 2022; BLOOM, MPT): a per-head bias proportional to the distance
// between query and key, added to the scaled scores in place of position embeddings.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>

namespace torchattn::backends {

// [num_heads] float32 on the CPU: the slopes of the ALiBi paper for any head count, as
// BLOOM's build_alibi_tensor computes them: base^1 .. base^n for the largest power of
// two n <= num_heads, base = 2^(-8/n), then every other power of the next one's base
// for the heads left over.
at::Tensor alibi_slopes(int64_t num_heads);

// [B or 1, H, Tq, Tk] of `dtype` on the slopes' device: slope_h * (position of key j -
// position of query i), where positions count the real tokens of each sequence
// (key_padding [B, Tk] bool, true = padding; undefined: none) and the Tq queries are the
// last Tq keys, or, given query_start (an int64 scalar tensor on the slopes' device:
// a static-shape cache's write position), the keys query_start .. query_start + Tq - 1
// (no host synchronisation: capturable in a CUDA graph). Computed in float32 for
// float32 and narrower dtypes (as BLOOM, then rounded once), in float64 for float64.
at::Tensor alibi_bias(const at::Tensor& slopes, const at::Tensor& key_padding, int64_t Tq, int64_t Tk,
                      c10::ScalarType dtype, const at::Tensor& query_start = at::Tensor());

}  // namespace torchattn::backends

#pragma once

// softmax(q k^T * scale) v over causal rows on the CPU, for the many queries of a
// prefill (no gradient). ATen's CPU flash kernel computes each key block of up to 512
// keys that holds a visible key in full, so below 512 keys a causal prefill costs what
// the whole square does: on an AMD EPYC Zen 5 (2 threads, 9 heads of 64, 512 queries)
// 3.52 ms causal against 3.48 ms with no mask. Here each block of query rows computes
// the products of the keys it sees only, a tile of rows x keys at a time (the keys
// packed transposed, so a tile is one broadcast and a few FMAs per head dimension),
// then an exact softmax over the row (no running rescale: a block's scores fit in a
// scratch row), then the weighted values, a tile of rows x columns at a time.

#include <torchattn/detail/kernels/cpu/cpu_features.h>

#include <ATen/core/Tensor.h>

namespace torchattn::kernels::cpu {

/// Whether prefill_attention applies: float32 CPU q [B, H, Tq, d], k [B, Hkv, Tk, d]
/// and v [B, Hkv, Tk, dv], each with unit stride in its last dimension, H a multiple
/// of Hkv, 1 <= Tq <= Tk, dv a multiple of 16, nothing to differentiate, and a CPU
/// with AVX2 and FMA at least (the scalar loop is for tests: ATen's kernel, on
/// MKL, is faster there).
bool prefill_attention_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

/// Returns [B, H, Tq, dv], float32: row t of each head attends over keys
/// 0 .. t + Tk - Tq (causal, aligned bottom-right: a chunk after Tk - Tq earlier keys;
/// top-left when Tq == Tk), query head h over key head h / (H / Hkv); scale: the
/// factor of the scores (> 0). Requires the shapes, dtypes and devices of
/// prefill_attention_applies (any CPU). Equal to ATen's kernels within float32 rounding
/// (another order of sums).
at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale);

/// prefill_attention with the instructions of `isa`, one of supported_isas() (tests,
/// benchmarks).
at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale, Isa isa);

}  // namespace torchattn::kernels::cpu

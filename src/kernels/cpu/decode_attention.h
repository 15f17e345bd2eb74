#pragma once

// softmax(q k^T * scale + mask) v for the few query rows of a decoding step on the
// CPU. ATen's CPU flash kernel opens a parallel region for every call, however small:
// at one query per head its thread start-up and join cost more than the work, and on a
// machine where another process holds a core a worker that is not scheduled stalls the
// step (the join waits for it). Here the rows run on the calling thread unless there is
// enough work per thread (long contexts) to pay for a parallel region.

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace torchattn::kernels::cpu {

/// The most query rows per head decode_attention takes (a decoding step, grouped
/// heads folded into rows, or a short chunk); more go to the fused kernels.
inline constexpr int64_t kDecodeAttentionRows = 16;

/// Whether decode_attention applies: float32 CPU q [B, H, Tq, d] with Tq <=
/// kDecodeAttentionRows, k [B, Hkv, Tk, d] and v [B, Hkv, Tk, dv] with H a multiple of
/// Hkv (query head h reads key head h / (H / Hkv)), each with unit stride in its last
/// dimension, no gradient to compute, and a mask that is undefined, bool (true =
/// attend) or float32 (added to the scores) and broadcastable to [B, H, Tq, Tk].
bool decode_attention_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask);

/// Returns [B, H, Tq, dv], float32; requires decode_attention_applies. scale: the
/// factor of the scores. A row whose every key is masked gives zeros. Equal to ATen's
/// kernels within float32 rounding (a different summation order).
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                            double scale);

}  // namespace torchattn::kernels::cpu

#pragma once

// Attention of the few queries of a static-shape decoding step over a whole cache on
// CUDA, in one pass over the keys that are visible (flash-decoding: the keys split in
// chunks across the GPU, each chunk's softmax partials combined after).
//
// A static-shape step (a CUDA graph's replay) attends over the cache's whole capacity
// and learns from a device tensor which slots are written. ATen's kernels take that
// as a [Tq, Tk] mask built by a few small kernels and then read every slot, written or
// not; the memory-efficient kernel also spreads one query's keys over few blocks. Here
// the position is read on the device, chunks past the last visible key return at
// once, and no mask is made. Only a build with a CUDA LibTorch defines these
// (TORCHATTN_WITH_CUDA); src/backends/selector.cpp calls them for Backend::Auto.

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace torchattn::kernels::cuda {

/// The most query rows per head static_decode_attention takes (a decoding step or a
/// short chunk); more go to ATen.
inline constexpr int64_t kStaticDecodeRows = 16;
/// The largest head dimension (of queries and keys, and of values) it takes.
inline constexpr int64_t kStaticDecodeMaxHeadDim = 256;

/// Which cache slots query i (at absolute position positions[0] + i) sees, as
/// backends::hidden_keys describes a static-shape call:
/// - not causal: every slot up to positions[0] + Tq - 1 (all written ones);
/// - causal without a buffer: slots j <= positions[0] + i, and with a window also
///   j > positions[0] + i - window;
/// - causal with a buffer (the notebooks' [C, C] triu(ones, 1), nonzero = hidden):
///   the slots whose entry in the buffer's row positions[0] + i is zero (a row past
///   the buffer's end sees none), and the window as above.
struct StaticDecodeMask {
  /// [1] int64 on q's device: the position of query 0.
  at::Tensor positions;
  bool causal = false;
  /// > 0: sliding window (causal only); 0: none.
  int64_t window = 0;
  /// Undefined, or [C, C'] of q's dtype with unit stride in its last dimension, C' >= Tk.
  at::Tensor buffer;
};

/// Whether static_decode_attention applies: q [B, H, Tq, d] on CUDA, float32, float16
/// or bfloat16, Tq <= kStaticDecodeRows; k [B, Hkv, Tk, d] and v [B, Hkv, Tk, dv] of
/// q's dtype and device, H a multiple of Hkv, d and dv at most kStaticDecodeMaxHeadDim,
/// every one with unit stride in its last dimension; no gradient to compute (grad
/// mode off, or no input requires it); the mask's positions a [1] int64 tensor on q's
/// device and its buffer, if any, as StaticDecodeMask says.
bool static_decode_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const StaticDecodeMask& mask);

/// softmax(q k^T * scale, hidden keys at -inf) v, computed in float32 with the
/// result rounded once to q's dtype. Returns [B, H, Tq, dv], contiguous. Query head h
/// reads key head h / (H / Hkv). A query that sees no key gives zeros. Needs
/// static_decode_applies; everything runs on the current CUDA stream with no host
/// synchronisation, so a CUDA graph can capture it.
at::Tensor static_decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const StaticDecodeMask& mask, double scale);

}  // namespace torchattn::kernels::cuda

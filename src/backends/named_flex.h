#pragma once

// The named variants on the flex kernels: the library's own instances of
// flex_attention (include/torchattn/flex_attention.h) for a module's softcap, ALiBi and
// sliding window, with its causal mask, on the CPU. Flex's tiles apply the softcap and
// ALiBi's distances to the scores in registers, a block of keys at a time, and skip the
// blocks a window hides, where the dedicated paths write each block of queries' scores
// out and back (softcap: backends/blocked.h) or build a [B, H, Tq, Tk] bias (ALiBi)
// or a [Tq, Tk] mask (the window) for ATen's kernels. The causal prefill and the
// decoding step with none of them are instances too (the table's cpu_flex_causal and
// cpu_flex_decode): IdentityScore under flex::Causal, or over every key.

#include "backends/mask_spec.h"

#include <torchattn/attention_options.h>

#include <ATen/core/Tensor.h>

namespace torchattn::backends {

/// Whether the named flex instances apply to this call (the table, selector.h): q [B,
/// H, Tq, d] (k and v [B, Hkv, Tk, d]) float32 or float64 on the CPU; a softcap,
/// ALiBi's slopes or a window (not a softcap with ALiBi), Backend::Auto, no sinks, no
/// user flex variant, no dropout in training; the spec with no key masks (padding, key
/// bias, a score bias).
bool named_flex_applies(const at::Tensor& q, const MaskSpec& spec, const functional::AttentionOptions& config);

/// q: [B, H, Tq, d], k: [B, Hkv, Tk, d], v: [B, Hkv, Tk, dv] (named_flex_applies, or the
/// table's causal prefill and decoding step) -> [B, H, Tq, dv]: scale * q k^T through
/// Softcap's or Alibi's score_mod (the queries the last Tq keys; neither: the scores as
/// they are), the keys each query sees as the spec says (all; causal after spec.past
/// keys; a window; a static cache's slots up to its position + Tq, the others never
/// read), by
/// flex_attention's forward and, with a gradient to compute, its backward. The
/// dedicated paths' numbers within float32 rounding (sums in another order).
at::Tensor named_flex_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const MaskSpec& spec,
                                const functional::AttentionOptions& config);

}  // namespace torchattn::backends

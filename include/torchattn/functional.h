#pragma once

// The attention math of the notebooks as free functions on tensors.
//
// Shapes use B (batch), H (heads), Tq / Tk (query / key tokens), d (features per
// head). "..." is any number of leading batch dimensions, including none.

#include <torchattn/backend.h>

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

#include <cstdint>
#include <optional>

namespace torchattn::functional {

/// The additive causal mask of notebook 004: 0 on and below the diagonal,
/// `neg_large` above it (key k > query t is blocked).
///
/// Returns [T, T] (float32 unless `options` says otherwise); it broadcasts to
/// [B, H, T, T] when added to scores.
///
///   auto m = torchattn::functional::make_causal_mask(4);  // [[0,-1e9,-1e9,-1e9], ...]
at::Tensor make_causal_mask(int64_t T, double neg_large = -1e9, at::TensorOptions options = {});

/// The attention weights of notebook 002's `dot_product_attention`:
/// softmax(q k^T / sqrt(d) + (1 - mask) * -1e9). Shapes as below; returns [..., Tq, Tk].
at::Tensor dot_product_attention_weights(const at::Tensor& q, const at::Tensor& k, const at::Tensor& mask = {},
                                         bool scale = true);

/// `dot_product_attention` of notebook 002: softmax(q k^T / sqrt(d) + (1 - mask) * -1e9) v.
///
/// q: [..., Tq, d], k: [..., Tk, d], v: [..., Tk, dv]
/// mask: optional, broadcastable to [..., Tq, Tk]; 1 keeps a key, 0 hides it.
/// scale: divide the scores by sqrt(d) (d = k.size(-1)) when true.
/// Returns [..., Tq, dv].
at::Tensor dot_product_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& mask = {}, bool scale = true);

/// `causal_dot_product_attention` of notebook 002: dot_product_attention with
/// mask = tril(ones(Tq, Tq)). Shapes as above, with Tk == Tq.
at::Tensor causal_dot_product_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        bool scale = true);

/// The modules' registered buffer: triu(ones(T, T), diagonal=1), 1 = hidden.
/// Returns [T, T] float32 unless `options` says otherwise.
at::Tensor causal_mask_buffer(int64_t T, at::TensorOptions options = {});

/// The `-inf` method of notebooks 000, 001 and 003: scores.masked_fill(hide, -inf),
/// then softmax over the last dimension.
///
/// scores: [..., Tq, Tk]; hide: bool (or 0/1) broadcastable to scores, true = hidden.
/// A row whose keys are all hidden comes out NaN, as in the notebook math.
at::Tensor masked_softmax(const at::Tensor& scores, const at::Tensor& hide);

/// The mask-after-softmax method of notebook 001: softmax over all keys, multiply
/// by `keep` (1 keep, 0 hide), then divide each row by its remaining sum.
/// Equal to masked_softmax(scores, keep == 0) up to rounding.
///
/// scores: [..., Tq, Tk]; keep: broadcastable to scores.
at::Tensor softmax_mask_renormalize(const at::Tensor& scores, const at::Tensor& keep);

/// at::linear(x, weight, bias): x W^T + b, faster where nothing needs its gradient
/// (float32 on the CPU, no gradient to compute):
/// - at most 8 rows of x (decoding): the product runs on every intra-op thread
///   (LibTorch's BLAS keeps such matrix-vector products on one);
/// - more rows (a prefill): oneDNN's inner product, LibTorch's `mkldnn::_linear_pointwise`
///   operator where the build has it, on the weight as it is (no packed copy).
/// The sums then run in another order: equal to at::linear within float32 rounding.
/// Anything else is at::linear. The modules' forward_cached (inference only) projects
/// through it; their forward keeps LibTorch's Linear, so its numbers do not depend on
/// the grad mode.
///
/// x: [..., in], weight: [out, in], bias: [out] or undefined. Returns [..., out].
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});

/// How `attention` computes.
struct AttentionConfig {
  /// Multiplies q k^T. Unset: divide by sqrt(d) with d = k.size(-1), as the notebooks do.
  std::optional<double> scale = std::nullopt;
  /// Probability of zeroing an attention weight (rescaling the rest by 1/(1-p)).
  double dropout = 0.0;
  /// Dropout only acts in training mode.
  bool training = false;
  Backend backend = Backend::Auto;
  /// Gemma 2's logit softcapping (> 0): the scaled scores become
  /// softcap * tanh(scores / softcap). Unset: none.
  std::optional<double> softcap = std::nullopt;
  /// gpt-oss' attention sinks: [num_heads] logits, one per query head, that join each
  /// row's softmax (their column then dropped), so a row may give its keys less than
  /// all of its weight. Undefined: none.
  at::Tensor sinks = at::Tensor();
};

/// The backend that `attention` runs for this configuration: Auto becomes SDPA,
/// or Reference in training mode with dropout > 0 (exact dropout parity with Python).
Backend resolve_backend(const AttentionConfig& config);

/// Causal attention weights of the Reference backend: softmax(mask(q k^T) * scale).
///
/// q: [..., Tq, d], k: [..., Tk, d].
/// causal_mask: the modules' [C, C] buffer triu(ones, 1) (nonzero = hidden), or
///   undefined for no mask. Query i stands at absolute position past + i and sees
///   keys 0 .. past + i (bottom-right alignment), so Tk == past + Tq <= C.
/// Returns [..., Tq, Tk].
at::Tensor attention_weights(const at::Tensor& q, const at::Tensor& k, const at::Tensor& causal_mask, int64_t past,
                             std::optional<double> scale);

/// Attention as the modules compute it, on the backend `config` resolves to.
///
/// q: [B, ..., Tq, d], k: [B, ..., Tk, d], v: [B, ..., Tk, dv]; causal_mask and past
/// as in `attention_weights`.
/// key_padding_mask: optional bool [B, Tk] (or [1, Tk], broadcast over the batch);
///   true marks a padding key that no query sees, as torch.nn.MultiheadAttention's
///   key_padding_mask (the opposite of at::scaled_dot_product_attention's bool
///   attn_mask, where true = attend). A floating tensor here is an error.
/// key_bias: optional [B, Tk] (or [1, Tk]) of q's dtype, added to the scaled scores
///   of each key: 0 keeps a key, -inf hides it, other values weigh it.
/// A query row that sees no key at all (every key it may see is hidden) comes out
/// as zeros on every backend, with zero, finite gradients; never NaN.
/// Returns [B, ..., Tq, dv].
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& causal_mask,
                     int64_t past, const AttentionConfig& config, const at::Tensor& key_padding_mask = {},
                     const at::Tensor& key_bias = {});

}  // namespace torchattn::functional

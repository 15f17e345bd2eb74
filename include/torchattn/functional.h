#pragma once

// The attention math of the notebooks as free functions on tensors.
//
// Shapes use B (batch), H (heads), Tq / Tk (query / key tokens), d (features per
// head). "..." is any number of leading batch dimensions, including none.

#include <torchattn/attention_options.h>
#include <torchattn/backend.h>

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace torchattn::functional {

/// The additive causal mask of notebook 004: [T, T] (float32 unless `options` says
/// otherwise), 0 on and below the diagonal, `neg_large` above it.
///
///   auto m = torchattn::functional::make_causal_mask(4);  // [[0,-1e9,-1e9,-1e9], ...]
at::Tensor make_causal_mask(int64_t T, double neg_large = -1e9, at::TensorOptions options = {});

/// The weights of `dot_product_attention` (below), [..., Tq, Tk].
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
/// scores: [..., Tq, Tk]; hide: bool (or 0/1) broadcastable to scores, true = hidden.
/// A row whose keys are all hidden comes out NaN, as in the notebook math.
at::Tensor masked_softmax(const at::Tensor& scores, const at::Tensor& hide);

/// The mask-after-softmax method of notebook 001: softmax over all keys, multiply
/// by `keep` (1 keep, 0 hide), then divide each row by its remaining sum.
/// Equal to masked_softmax(scores, keep == 0) up to rounding.
/// scores: [..., Tq, Tk]; keep: broadcastable to scores.
at::Tensor softmax_mask_renormalize(const at::Tensor& scores, const at::Tensor& keep);

/// at::linear(x, weight, bias) = x W^T + b, faster for float32 CPU inference (no
/// gradient to compute) and then equal within float32 rounding; otherwise at::linear.
/// See docs/modules.md#functions.
///
/// x: [..., in], weight: [out, in], bias: [out] or undefined. Returns [..., out].
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});

/// The backend that `attention` runs for this configuration: Auto becomes SDPA,
/// or Reference in training mode with dropout > 0.
Backend resolve_backend(const AttentionOptions& config);

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
///   true = a padding key that no query sees (see docs/masks.md). A floating tensor
///   here is an error.
/// key_bias: optional [B, Tk] (or [1, Tk]) of q's dtype, added to the scaled scores
///   of each key: 0 keeps a key, -inf hides it, other values weigh it.
/// A query row that sees no key at all (every key it may see is hidden) comes out
/// as zeros on every backend, with zero, finite gradients; never NaN.
/// Returns [B, ..., Tq, dv].
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& causal_mask,
                     int64_t past, const AttentionOptions& config, const at::Tensor& key_padding_mask = {},
                     const at::Tensor& key_bias = {});

/// How attention() with the same arguments runs: the names of the paths it takes in the
/// library's table (docs/architecture.md, "How a call is run"), the lowerings first and
/// the path that computes it last, e.g. {"masks_as_aten", "cpu_decode_kernel"} for a
/// decoding step on the CPU. The same checks as attention(); masks are made, the
/// attention is not. The names are stable; the choice may change between releases.
std::vector<std::string> attention_path(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const at::Tensor& causal_mask, int64_t past, const AttentionOptions& config,
                                        const at::Tensor& key_padding_mask = {}, const at::Tensor& key_bias = {});

/// Documents packed end to end (FlashAttention's varlen form), each attending within
/// itself only: attention() on each document alone, on the backend `config` resolves
/// to, with no [N, N] mask made, so the work grows with the sum of the documents'
/// squared lengths.
///
/// q: [..., N, d], k: [..., N, d], v: [..., N, dv] (the tokens of all documents along
/// -2, the same leading dimensions, heads included). cu_seqlens: [S + 1] int32 or
/// int64 on the CPU or q's device, document s being tokens cu_seqlens[s] ..
/// cu_seqlens[s + 1] (0 first, N last, every document at least one token); read on
/// the host. causal: each token sees the earlier tokens of its document (else all of
/// them). Returns [..., N, dv].
at::Tensor attention_packed(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens,
                            bool causal, const AttentionOptions& config = {});

}  // namespace torchattn::functional

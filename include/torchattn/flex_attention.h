#pragma once

// FlexAttention for C++: an attention variant written as two small callables, inlined
// into the kernel by the compiler of the translation unit that calls flex_attention
// (PyTorch's torch.nn.attention.flex_attention needs torch.compile for that):
//
//   score_mod(score, b, h, q_idx, kv_idx) -> score   changes a score (ALiBi, a relative
//                                                    bias, softcapping); generic in the
//                                                    score's type T
//   mask_mod(b, h, q_idx, kv_idx) -> bool            true where query q_idx sees key kv_idx
//
// create_block_mask records, per block of queries, which blocks of keys are empty (never
// computed), full (computed without calling mask_mod) or partial (mask_mod called per
// key), as PyTorch's BlockMask does, so a sparse pattern (documents, a window) computes
// only the blocks it keeps.
//
//   auto causal = [](int64_t, int64_t, int64_t q, int64_t kv) { return q >= kv; };
//   auto mask = torchattn::create_block_mask(causal, 1, 1, T, T);
//   auto alibi = [](auto score, int64_t, int64_t h, int64_t q, int64_t kv) {
//     return score + 0.5 * (h + 1) * (kv - q); };
//   at::Tensor y = torchattn::flex_attention(q, k, v, alibi, mask).output;
//
// The forward and backward (CPU, float32 and float64) are the headers flex/cpu_forward.h
// and flex/cpu_backward.h, instantiated in the caller's translation unit; autograd
// reaches the backward through flex/autograd.h. docs/flex.md shows the library's
// variants as mods.

#include <torchattn/flex/autograd.h>
#include <torchattn/flex/block_mask.h>
#include <torchattn/flex/cpu_backward.h>
#include <torchattn/flex/cpu_forward.h>
#include <torchattn/flex/inputs.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <utility>

namespace torchattn {

/// What flex_attention takes besides the tensors and the mods.
struct FlexOptions {
  /// The scores' scale, applied before score_mod; unset: 1 / sqrt(D) (PyTorch's default).
  std::optional<double> scale;
  /// Also return the log-sum-exp of each query's modified scores (natural log).
  bool return_lse = false;

  FlexOptions& with_scale(double s) {
    scale = s;
    return *this;
  }
  FlexOptions& with_lse(bool on = true) {
    return_lse = on;
    return *this;
  }
};

/// flex_attention's result: output [B, H, Tq, Dv], and with return_lse the log-sum-exp
/// [B, H, Tq] (float32 or float64 as the inputs; undefined otherwise).
struct FlexResult {
  at::Tensor output;
  at::Tensor lse;
};

/// softmax(score_mod(q k^T * scale) where mask_mod holds, else -inf) v, per query.
///
/// q [B, H, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv]: CPU, contiguous or not, one
/// dtype, float32 or float64; H a multiple of Hkv (query head h reads key head
/// h / (H / Hkv), grouped heads). block_mask: made for (B or 1, H or 1, Tq, Tk).
///
/// A query that sees no key (its every block empty or masked) gets zeros and a
/// log-sum-exp of -inf (PyTorch's choice), and passes no gradient. A NaN score (from the
/// inputs or score_mod), or a +inf one, makes that query's output and log-sum-exp NaN.
///
/// Differentiable in q, k and v (where one requires grad and grad mode is on): the
/// backward runs score_mod on flex::Dual scores for its derivative (dual.h: call math
/// functions unqualified). Gradients for tensors a score_mod captures are not computed.
template <class ScoreMod, class MaskMod>
FlexResult flex_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, ScoreMod score_mod,
                          const BlockMask<MaskMod>& block_mask, const FlexOptions& options = {}) {
  const flex::Shapes s = flex::check_inputs(q, k, v, block_mask.shape, options.scale);
  flex::check_block_mask(block_mask.shape, block_mask.kv_num_blocks, block_mask.kv_indices, "kv_num_blocks");
  flex::check_block_mask(block_mask.shape, block_mask.full_kv_num_blocks, block_mask.full_kv_indices,
                         "full_kv_num_blocks");
  if (!(at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad()))) {
    auto [out, lse] = flex::cpu_forward(q, k, v, s, score_mod, block_mask);
    return {std::move(out), options.return_lse ? std::move(lse) : at::Tensor()};
  }
  auto backward = c10::make_intrusive<flex::Backward>();
  backward->run = [s, score_mod, block_mask](const at::Tensor& q_, const at::Tensor& k_, const at::Tensor& v_,
                                             const at::Tensor& out, const at::Tensor& lse, const at::Tensor& dout) {
    return flex::cpu_backward(q_, k_, v_, out, lse, dout, s, score_mod, block_mask);
  };
  auto outputs = flex::FlexFunction::apply(
      q, k, v, [&] { return flex::cpu_forward(q, k, v, s, score_mod, block_mask); }, backward);
  return {std::move(outputs[0]), options.return_lse ? std::move(outputs[1]) : at::Tensor()};
}

/// Every key visible (no block mask).
template <class ScoreMod>
FlexResult flex_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, ScoreMod score_mod,
                          const FlexOptions& options = {}) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4, "flex_attention: expected q and k of 4 dimensions [B, H, T, D], got ",
              q.dim(), " and ", k.dim());
  const auto mask = create_block_mask(VisibleKeys{}, 1, 1, q.size(2), k.size(2));
  return flex_attention(q, k, v, std::move(score_mod), mask, options);
}

/// The scores as they are (no score_mod).
template <class MaskMod>
FlexResult flex_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const BlockMask<MaskMod>& block_mask, const FlexOptions& options = {}) {
  return flex_attention(q, k, v, IdentityScore{}, block_mask, options);
}

}  // namespace torchattn

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
// The forward and backward (CPU, float32 and float64) are the headers detail/flex/cpu_forward.h
// and detail/flex/cpu_backward.h, instantiated in the caller's translation unit; autograd
// reaches the backward through flex/autograd.h. docs/flex.md shows the library's
// variants as mods.

#include <torchattn/flex/autograd.h>
#include <torchattn/flex/block_mask.h>
#include <torchattn/detail/flex/cpu_backward.h>
#include <torchattn/detail/flex/cpu_forward.h>
#include <torchattn/flex/inputs.h>
#include <torchattn/flex/lanes.h>
#include <torchattn/flex/mods.h>
#include <torchattn/flex/score_formulas.h>
#include <torchattn/flex/variant.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

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
/// Differentiable in q, k and v (where one requires grad and grad mode is on), through
/// the output and the log-sum-exp: the backward runs score_mod on flex::Dual scores for
/// its derivative (dual.h: call math functions unqualified; a cast of the score to a
/// number does not compile). Gradients for tensors a score_mod captures are not
/// computed, and there is no second derivative: a backward through the gradients
/// (create_graph, then backward again) is an error naming flex_attention.
///
/// score_mod and mask_mod of another signature are a compile error naming the expected
/// one (flex/mods.h); a ready-made mod's table is checked against the call's heads and
/// lengths (flex/variants.h).
template <class ScoreMod, class MaskMod>
FlexResult flex_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, ScoreMod score_mod,
                          const BlockMask<MaskMod>& block_mask, const FlexOptions& options = {}) {
  if constexpr (!(flex::CheckedScoreMod<ScoreMod>::value && flex::CheckedMaskMod<MaskMod>::value)) {
    return {};  // their static_asserts said why; no kernel is instantiated
  } else {
    const flex::Shapes s = flex::check_inputs(q, k, v, block_mask.shape, options.scale);
    flex::check_block_mask(block_mask.shape, block_mask.full_kv_num_blocks, block_mask.full_kv_indices,
                           block_mask.kv_num_blocks, block_mask.kv_indices);
    const flex::ModSizes sizes{s.B, s.H, s.Tq, s.Tk};
    flex::check_mod(score_mod, sizes);
    flex::check_mod(block_mask.mask_mod, sizes);
    if (!(at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad()))) {
      auto [out, lse] = flex::cpu_forward(q, k, v, s, score_mod, block_mask);
      return {std::move(out), options.return_lse ? std::move(lse) : at::Tensor()};
    }
    auto backward = c10::make_intrusive<flex::Backward>();
    backward->run = [s, score_mod, block_mask](const at::Tensor& q_, const at::Tensor& k_, const at::Tensor& v_,
                                               const at::Tensor& out, const at::Tensor& lse, const at::Tensor& dout,
                                               const at::Tensor& dlse) {
      return flex::cpu_backward(q_, k_, v_, out, lse, dout, dlse, s, score_mod, block_mask);
    };
    auto outputs = flex::FlexFunction::apply(
        q, k, v, [&] { return flex::cpu_forward(q, k, v, s, score_mod, block_mask); }, backward);
    return {std::move(outputs[0]), options.return_lse ? std::move(outputs[1]) : at::Tensor()};
  }
}

/// Every key visible (no block mask).
template <class ScoreMod>
FlexResult flex_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, ScoreMod score_mod,
                          const FlexOptions& options = {}) {
  if constexpr (!flex::CheckedScoreMod<ScoreMod>::value) {
    return {};
  } else {
    TORCH_CHECK(q.defined() && k.defined() && q.dim() == 4 && k.dim() == 4,
                "flex_attention: expected q and k of 4 dimensions [B, H, T, D], got ", q.defined() ? q.dim() : 0,
                " and ", k.defined() ? k.dim() : 0);
    const auto mask = create_block_mask(VisibleKeys{}, 1, 1, q.size(2), k.size(2));
    return flex_attention(q, k, v, std::move(score_mod), mask, options);
  }
}

/// The scores as they are (no score_mod).
template <class MaskMod>
FlexResult flex_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const BlockMask<MaskMod>& block_mask, const FlexOptions& options = {}) {
  return flex_attention(q, k, v, IdentityScore{}, block_mask, options);
}

namespace flex {

/// A flex_variant's mask_mod at a call's positions: query q_idx at q_idx + offset, and
/// with `causal` the keys after it hidden, with a window (> 0) those window or more
/// before it too.
template <class MaskMod>
struct MaskAtPositions {
  MaskMod mask_mod;
  int64_t offset;
  bool causal;
  int64_t window = 0;
  bool operator()(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx) const {
    const int64_t position = q_idx + offset;
    return (!causal || kv_idx <= position) && (window <= 0 || position - kv_idx < window) &&
           mask_mod(b, h, position, kv_idx);
  }
  /// The run of keys (RangedMask) where mask_mod names its own.
  KeyRange keys(int64_t q_idx) const
    requires RangedMask<MaskMod>
  {
    const int64_t position = q_idx + offset;
    KeyRange run = mask_mod.keys(position);
    if (causal) run = run & KeyRange{0, position + 1};
    if (window > 0) run = run & KeyRange{position - window + 1, run.end};
    return run;
  }
  /// mask_mod's own check, its queries at their positions.
  void check(const ModSizes& sizes) const {
    check_mod(mask_mod, {sizes.batch, sizes.heads, sizes.q_len + offset, sizes.kv_len});
  }
};

/// A flex_variant's score_mod at a call's positions, after the module's softcap (> 0)
/// and ALiBi (slopes, one per query head) where the call has them, in the order the
/// module applies them without a variant. IdentityScore: those alone.
template <class ScoreMod>
struct ScoreAtPositions {
  static constexpr bool kScoresInLanes = std::is_same_v<ScoreMod, IdentityScore> || runs_in_lanes<ScoreMod>;
  ScoreMod score_mod;
  int64_t offset;
  double softcap = 0.0;
  std::vector<double> slopes = {};
  template <class T, class I>
  auto operator()(T score, int64_t b, int64_t h, int64_t q_idx, I kv_idx) const {
    const int64_t position = q_idx + offset;
    T z = score;
    if (softcap > 0.0) z = softcapped(z, softcap);
    if (!slopes.empty()) z = with_alibi(z, slopes[static_cast<size_t>(h)], position, kv_idx);
    if constexpr (std::is_same_v<ScoreMod, IdentityScore>) {
      return z;
    } else {
      return score_mod(z, b, h, position, kv_idx);
    }
  }
  void check(const ModSizes& sizes) const {
    if (!slopes.empty()) check_alibi_slopes(slopes.size(), sizes.heads, "flex_variant (the module's ALiBi)");
    check_mod(score_mod, {sizes.batch, sizes.heads, sizes.q_len + offset, sizes.kv_len});
  }
};

}  // namespace flex

/// How flex_variant asks a mask_mod for each call's block mask.
struct FlexVariantOptions {
  /// Ask mask_mod for every batch (b = 0 .. B - 1), every head; false: once, with b
  /// (h) = 0, the pattern serving every batch (head): a mask_mod that reads b (h) needs
  /// true.
  bool per_batch = false;
  bool per_head = false;
  /// The block mask's block size.
  int64_t block_size = 128;
};

/// score_mod and mask_mod as a FlexVariant (flex/variant.h) for
/// MultiHeadAttentionOptions::flex and functional::AttentionOptions::flex, their kernels
/// instantiated here, in the caller's translation unit. Each call runs flex_attention
/// with q_idx = call.q_offset + i (a KV cache's decoding step passes its position) and,
/// for a causal call, keys after the query hidden as well; its block mask is made for
/// the call's sizes and kept for the next call of the same sizes and positions (a
/// training loop's), so mask_mod must give the same answer for the same arguments. The
/// module's own window, softcap and ALiBi (FlexCall) compose with the mods: the window
/// hides keys as the causal mask does, and score_mod sees the score after the softcap
/// and ALiBi's distance, as the module without a variant computes it. The
/// mods are copied into the variant (and must be copyable); a copy of the variant
/// shares the kept mask (guarded for calls from several threads).
template <class ScoreMod, class MaskMod>
FlexVariant flex_variant(ScoreMod score_mod, MaskMod mask_mod, const FlexVariantOptions& options = {}) {
  if constexpr (!(flex::CheckedScoreMod<ScoreMod>::value && flex::CheckedMaskMod<MaskMod>::value)) {
    return {};
  } else {
    TORCH_CHECK(options.block_size >= 1, "flex_variant: expected a block_size of at least 1, got ", options.block_size);
    struct Kept {
      std::mutex mutex;
      std::array<int64_t, 7> sizes{};
      std::optional<BlockMask<flex::MaskAtPositions<MaskMod>>> mask;
    };
    auto kept = std::make_shared<Kept>();
    return [score_mod = std::move(score_mod), mask_mod = std::move(mask_mod), options,
            kept](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const FlexCall& call) -> at::Tensor {
      TORCH_CHECK(q.dim() == 4 && k.dim() == 4, "flex_variant: expected q and k of 4 dimensions [B, H, T, D], got ",
                  q.dim(), " and ", k.dim());
      const int64_t B = options.per_batch ? q.size(0) : 1, H = options.per_head ? q.size(1) : 1;
      const std::array<int64_t, 7> sizes{B, H, q.size(2), k.size(2), call.q_offset, call.causal ? 1 : 0, call.window};
      const BlockMask<flex::MaskAtPositions<MaskMod>> mask = [&] {
        const std::lock_guard<std::mutex> lock(kept->mutex);
        if (!kept->mask || kept->sizes != sizes) {
          kept->mask.emplace(
              create_block_mask(flex::MaskAtPositions<MaskMod>{mask_mod, call.q_offset, call.causal, call.window}, B, H,
                                q.size(2), k.size(2), options.block_size));
          kept->sizes = sizes;
        }
        return *kept->mask;
      }();
      const FlexOptions flex_options = FlexOptions().with_scale(call.scale);
      if constexpr (std::is_same_v<ScoreMod, IdentityScore>) {
        if (call.softcap <= 0.0 && call.alibi_slopes.empty()) {
          return flex_attention(q, k, v, IdentityScore{}, mask, flex_options).output;
        }
      }
      return flex_attention(q, k, v,
                            flex::ScoreAtPositions<ScoreMod>{score_mod, call.q_offset, call.softcap, call.alibi_slopes},
                            mask, flex_options)
          .output;
    };
  }
}

}  // namespace torchattn

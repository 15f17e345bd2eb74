#pragma once

// The library's attention variants as ready-made flex_attention mods (flex_attention.h),
// each equal to the library's own path for it on the same inputs (MaskSpec's causal and
// window, attend_documents, alibi_bias, the blocked softcap; a score_bias tensor for
// prefix-LM and the relative bias, which have none): tests/backends/test_flex_variants.cpp.
//
//   mask_mods (b, h, q_idx, kv_idx) -> bool     Causal, SlidingWindow, PrefixLM, Documents
//   score_mods (score, b, h, q_idx, kv_idx)     Alibi, Softcap, RelativeBias
//   and_masks, or_masks                         mask_mods combined, as PyTorch's
//
//   auto mask = torchattn::create_block_mask(torchattn::flex::SlidingWindow(64), 1, 1, T, T);
//   auto y = torchattn::flex_attention(q, k, v, torchattn::flex::Alibi(H), mask).output;
//
// Positions: with Tq queries over Tk keys, query q_idx stands at position offset + q_idx
// and key kv_idx at kv_idx. offset 0 aligns the queries with the first keys (PyTorch's
// flex_attention examples); offset Tk - Tq with the last ones, as a KV cache's decoding
// step does (MaskSpec::past, the modules' forward_cached).
//
// The score_mods read their captured numbers (slopes, a bias table) from plain vectors
// of double, never from tensors, and call tanh unqualified, so that the backward's
// flex::Dual scores go through them (dual.h).

#include <torchattn/flex/mods.h>
#include <torchattn/flex/score_formulas.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/scalar_tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

namespace torchattn::flex {

// ---------------------------------------------------------------------------
// mask_mods
// ---------------------------------------------------------------------------

/// Causal: query q_idx (at position offset + q_idx) sees the keys 0 .. offset + q_idx.
/// offset >= 0; Tk - Tq for queries that are the last of the keys (MaskSpec{causal,
/// past = Tk - Tq}).
struct Causal {
  int64_t offset = 0;

  Causal() = default;
  explicit Causal(int64_t offset_) : offset(offset_) {
    TORCH_CHECK(offset >= 0, "flex::Causal: expected an offset >= 0, got ", offset);
  }
  bool operator()(int64_t /*b*/, int64_t /*h*/, int64_t q_idx, int64_t kv_idx) const {
    return kv_idx <= offset + q_idx;
  }
  KeyRange keys(int64_t q_idx) const { return {0, offset + q_idx + 1}; }
};

/// Sliding window (MaskSpec::window): the query at position i = offset + q_idx sees the
/// keys j with i - window < j <= i, itself and the window - 1 before it. window >= 1,
/// offset >= 0 (as Causal's).
struct SlidingWindow {
  int64_t window;
  int64_t offset = 0;

  explicit SlidingWindow(int64_t window_, int64_t offset_ = 0) : window(window_), offset(offset_) {
    TORCH_CHECK(window >= 1, "flex::SlidingWindow: expected a window >= 1, got ", window);
    TORCH_CHECK(offset >= 0, "flex::SlidingWindow: expected an offset >= 0, got ", offset);
  }
  bool operator()(int64_t /*b*/, int64_t /*h*/, int64_t q_idx, int64_t kv_idx) const {
    const int64_t i = offset + q_idx;
    return kv_idx <= i && i - kv_idx < window;
  }
  KeyRange keys(int64_t q_idx) const { return {offset + q_idx - window + 1, offset + q_idx + 1}; }
};

/// Prefix-LM (T5's and UniLM's): every query sees the first `prefix` keys (the prompt,
/// attended bidirectionally), and the keys after them causally (Causal's, with its
/// offset). prefix >= 0 (0: Causal); offset >= 0.
struct PrefixLM {
  int64_t prefix;
  int64_t offset = 0;

  explicit PrefixLM(int64_t prefix_, int64_t offset_ = 0) : prefix(prefix_), offset(offset_) {
    TORCH_CHECK(prefix >= 0, "flex::PrefixLM: expected a prefix >= 0, got ", prefix);
    TORCH_CHECK(offset >= 0, "flex::PrefixLM: expected an offset >= 0, got ", offset);
  }
  bool operator()(int64_t /*b*/, int64_t /*h*/, int64_t q_idx, int64_t kv_idx) const {
    return kv_idx < prefix || kv_idx <= offset + q_idx;
  }
  KeyRange keys(int64_t q_idx) const { return {0, std::max(prefix, offset + q_idx + 1)}; }
};

/// Documents packed end to end (the modules' forward_packed, functional::attention_packed):
/// cu_seqlens [S + 1] = [0, l0, l0 + l1, ..., N] gives document s the tokens cu_seqlens[s]
/// .. cu_seqlens[s + 1] - 1 (FlashAttention's varlen form: 0 first, increasing, every
/// document at least one token). A token sees the tokens of its own document only, the
/// earlier ones (causal, the default, as the packed path of a causal module) or all of
/// them. For N x N block masks (Tq = Tk = N), one layout for every batch and head; the
/// document ids are shared between copies of the mod (cheap to copy into a block mask).
/// With a window: and_masks(Documents(...), SlidingWindow(w)).
class Documents {
 public:
  explicit Documents(const std::vector<int64_t>& cu_seqlens, bool causal = true) : causal_(causal) {
    TORCH_CHECK(cu_seqlens.size() >= 2, "flex::Documents: expected cu_seqlens of [S + 1] with S >= 1 documents, got ",
                cu_seqlens.size(), " offsets");
    TORCH_CHECK(cu_seqlens.front() == 0, "flex::Documents: expected cu_seqlens to start at 0, got ",
                cu_seqlens.front());
    auto tables = std::make_shared<Tables>();
    tables->ids.reserve(static_cast<size_t>(std::max<int64_t>(cu_seqlens.back(), 0)));
    for (size_t s = 0; s + 1 < cu_seqlens.size(); ++s) {
      TORCH_CHECK(cu_seqlens[s + 1] > cu_seqlens[s],
                  "flex::Documents: expected cu_seqlens increasing (every document at least one token), got ",
                  cu_seqlens[s], " then ", cu_seqlens[s + 1], " at document ", s);
      tables->ids.insert(tables->ids.end(), static_cast<size_t>(cu_seqlens[s + 1] - cu_seqlens[s]),
                         static_cast<int64_t>(s));
    }
    tables->offsets = cu_seqlens;
    ids_ = tables->ids.data();
    offsets_ = tables->offsets.data();
    tokens_ = static_cast<int64_t>(tables->ids.size());
    owner_ = std::move(tables);
  }
  /// cu_seqlens as the modules take it: [S + 1] int32 or int64 (on any device: copied
  /// to the host once).
  explicit Documents(const at::Tensor& cu_seqlens, bool causal = true) : Documents(offsets_of(cu_seqlens), causal) {}

  /// N, the tokens of all the documents.
  int64_t tokens() const { return tokens_; }
  /// The document of token i (0 <= i < N).
  int64_t document_of(int64_t i) const { return ids_[i]; }

  bool operator()(int64_t /*b*/, int64_t /*h*/, int64_t q_idx, int64_t kv_idx) const {
    TORCH_CHECK(q_idx < tokens_ && kv_idx < tokens_, "flex::Documents: expected a block mask of the documents' ",
                tokens_, " tokens, got query ", q_idx, " and key ", kv_idx);
    return ids_[q_idx] == ids_[kv_idx] && (!causal_ || kv_idx <= q_idx);
  }
  /// Query q_idx's document up to itself (causal) or whole.
  KeyRange keys(int64_t q_idx) const {
    TORCH_CHECK(q_idx < tokens_, "flex::Documents: expected a block mask of the documents' ", tokens_,
                " tokens, got query ", q_idx);
    const int64_t s = ids_[q_idx];
    return {offsets_[s], causal_ ? q_idx + 1 : offsets_[s + 1]};
  }

  /// The documents cover the keys and the queries, each N tokens long.
  void check(const ModSizes& sizes) const {
    TORCH_CHECK(sizes.kv_len == tokens_ && sizes.q_len == tokens_, "flex::Documents: cu_seqlens covers ", tokens_,
                " tokens, but the keys are ", sizes.kv_len, " and the queries ", sizes.q_len,
                " long; expected both the documents' length (an N x N mask of the packed tokens)");
  }

 private:
  static std::vector<int64_t> offsets_of(const at::Tensor& cu_seqlens) {
    TORCH_CHECK(cu_seqlens.defined(), "flex::Documents: expected cu_seqlens, got an undefined tensor");
    TORCH_CHECK(cu_seqlens.dim() == 1 &&
                    (cu_seqlens.scalar_type() == at::kInt || cu_seqlens.scalar_type() == at::kLong),
                "flex::Documents: expected cu_seqlens [S + 1] int32 or int64, got ", cu_seqlens.scalar_type(), " ",
                cu_seqlens.sizes());
    const at::Tensor host = cu_seqlens.to(at::kCPU, at::kLong).contiguous();
    const int64_t* p = host.const_data_ptr<int64_t>();
    return {p, p + host.numel()};
  }

  struct Tables {
    std::vector<int64_t> ids;      // the document of each token
    std::vector<int64_t> offsets;  // cu_seqlens
  };
  std::shared_ptr<const Tables> owner_;
  const int64_t* ids_ = nullptr;      // owner_'s ids
  const int64_t* offsets_ = nullptr;  // owner_'s offsets
  int64_t tokens_ = 0;
  bool causal_ = true;
};

/// mask_mods combined by && (All = true) or || (All = false), each one's check kept.
template <bool All, class... MaskMods>
struct CombinedMasks {
  std::tuple<MaskMods...> mask_mods;

  bool operator()(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx) const {
    return std::apply(
        [&](const auto&... m) {
          if constexpr (All) {
            return (m(b, h, q_idx, kv_idx) && ...);
          } else {
            return (m(b, h, q_idx, kv_idx) || ...);
          }
        },
        mask_mods);
  }
  /// and_masks of masks that each name their runs: the keys every run holds.
  KeyRange keys(int64_t q_idx) const
    requires(All && (RangedMask<MaskMods> && ...))
  {
    return std::apply([&](const auto&... m) { return (KeyRange{} & ... & m.keys(q_idx)); }, mask_mods);
  }
  void check(const ModSizes& sizes) const {
    std::apply([&](const auto&... m) { (check_mod(m, sizes), ...); }, mask_mods);
  }
};

/// True where every one of mask_mods is (PyTorch's and_masks): and_masks(Documents(cu),
/// SlidingWindow(w)) is the packed path with a window.
template <class... MaskMods>
CombinedMasks<true, MaskMods...> and_masks(MaskMods... mask_mods) {
  static_assert((CheckedMaskMod<MaskMods>::value && ...) || true);  // each wrong one: its own error
  return {std::tuple<MaskMods...>(std::move(mask_mods)...)};
}

/// True where any one of mask_mods is (PyTorch's or_masks).
template <class... MaskMods>
CombinedMasks<false, MaskMods...> or_masks(MaskMods... mask_mods) {
  static_assert((CheckedMaskMod<MaskMods>::value && ...) || true);  // each wrong one: its own error
  return {std::tuple<MaskMods...>(std::move(mask_mods)...)};
}

// ---------------------------------------------------------------------------
// score_mods: the score they are given is already scaled (q . k * scale).
// ---------------------------------------------------------------------------

/// ALiBi (Press et al., 2022; BLOOM, MPT; MultiHeadAttentionOptions::alibi): adds
/// slope_h * (kv_idx - (offset + q_idx)) to the score of query head h, a penalty growing
/// with the distance back to the key. Alibi(num_heads) takes BLOOM's slopes, those of
/// the library's ALiBi (float32: 2^(-8/n) .. 2^(-8) for the largest power of two n <=
/// num_heads, then every other power of 2^(-4/n) for the heads left over); Alibi(slopes)
/// takes its own, one per query head. The bias is computed in the score's type from the
/// slope and the distance (as backends::alibi_bias: float32 for float32). q must have at
/// most as many heads as there are slopes (checked at each call: an error naming both). offset >= 0: Tk - Tq as the
/// library's own ALiBi with a cache (its queries the last Tq keys).
struct Alibi {
  std::vector<double> slopes;
  int64_t offset = 0;

  explicit Alibi(int64_t num_heads, int64_t offset_ = 0) : Alibi(bloom_slopes(num_heads), offset_) {}
  explicit Alibi(std::vector<double> slopes_, int64_t offset_ = 0) : slopes(std::move(slopes_)), offset(offset_) {
    TORCH_CHECK(!slopes.empty(), "flex::Alibi: expected at least one slope");
    TORCH_CHECK(offset >= 0, "flex::Alibi: expected an offset >= 0, got ", offset);
  }

  /// The float32 forward runs it W keys at a time (lanes.h).
  static constexpr bool kScoresInLanes = true;

  template <class T, class I = int64_t>
  T operator()(T score, int64_t /*b*/, int64_t h, int64_t q_idx, I kv_idx) const {
    return with_alibi(score, slopes[static_cast<size_t>(h)], offset + q_idx, kv_idx);
  }

  /// One slope per query head (Alibi(heads) for BLOOM's).
  void check(const ModSizes& sizes) const { check_alibi_slopes(slopes.size(), sizes.heads, "flex::Alibi"); }

  /// BLOOM's slopes for num_heads >= 1 heads, as float32 numbers (the same tensor
  /// operations as the library's ALiBi, so the same bits).
  static std::vector<double> bloom_slopes(int64_t num_heads) {
    TORCH_CHECK(num_heads >= 1, "flex::Alibi: expected num_heads >= 1, got ", num_heads);
    int64_t n = 1;
    while (n * 2 <= num_heads) n *= 2;
    const auto base_of = [](int64_t m) {
      return std::pow(2.0, -std::pow(2.0, -(std::log2(static_cast<double>(m)) - 3.0)));
    };
    at::Tensor s = at::pow(at::scalar_tensor(base_of(n), at::kFloat), at::arange(1, 1 + n, at::kInt));
    if (n != num_heads) {
      const int64_t left = std::min(n, num_heads - n);
      s = at::cat(
          {s, at::pow(at::scalar_tensor(base_of(2 * n), at::kFloat), at::arange(1, 1 + 2 * left, 2, at::kInt))});
    }
    const at::Tensor d = s.to(at::kDouble).contiguous();
    return {d.const_data_ptr<double>(), d.const_data_ptr<double>() + d.numel()};
  }
};

/// Logit softcapping (Gemma 2; AttentionOptions::softcap): the scaled score s becomes
/// softcap * tanh(s / softcap), in (-softcap, softcap). softcap > 0 and finite.
struct Softcap {
  double softcap;

  explicit Softcap(double softcap_) : softcap(softcap_) {
    TORCH_CHECK(softcap > 0.0 && std::isfinite(softcap), "flex::Softcap: expected a finite softcap > 0, got ", softcap);
  }
  /// The float32 forward runs it W keys at a time (lanes.h).
  static constexpr bool kScoresInLanes = true;

  template <class T, class I = int64_t>
  T operator()(T score, int64_t /*b*/, int64_t /*h*/, int64_t /*q_idx*/, I /*kv_idx*/) const {
    return softcapped(score, softcap);
  }
};

/// A learned relative position bias: table [H or 1, 2 * max_distance + 1] (any floating
/// dtype and device, copied to the host as float64 once), and query head h adds
/// table[h][clamp(kv_idx - (offset + q_idx), -max_distance, max_distance) + max_distance]
/// to its score: one entry per distance up to max_distance either way, the farther
/// distances sharing the last ones. A table of one row serves every head; otherwise q
/// must have at most its rows of heads. offset >= 0 (as Causal's). The bias is the
/// table's entry rounded to the score's type. Rows other than 1 and fewer than q's heads
/// are an error at the call naming both.
class RelativeBias {
 public:
  explicit RelativeBias(const at::Tensor& table, int64_t offset = 0) : offset_(offset) {
    TORCH_CHECK(table.defined(), "flex::RelativeBias: expected a table, got an undefined tensor");
    TORCH_CHECK(table.dim() == 2 && table.size(0) >= 1 && table.size(1) % 2 == 1 &&
                    at::isFloatingType(table.scalar_type()),
                "flex::RelativeBias: expected a floating table [H or 1, 2 * max_distance + 1] (an odd width), got ",
                table.scalar_type(), " ", table.sizes());
    TORCH_CHECK(offset >= 0, "flex::RelativeBias: expected an offset >= 0, got ", offset);
    const at::Tensor host = table.detach().to(at::kCPU, at::kDouble).contiguous();
    auto values = std::make_shared<std::vector<double>>(host.const_data_ptr<double>(),
                                                        host.const_data_ptr<double>() + host.numel());
    values_ = values->data();
    owner_ = std::move(values);
    rows_ = table.size(0);
    max_distance_ = (table.size(1) - 1) / 2;
  }

  int64_t max_distance() const { return max_distance_; }

  /// One row for every head, or a row per query head.
  void check(const ModSizes& sizes) const {
    TORCH_CHECK(rows_ == 1 || rows_ >= sizes.heads, "flex::RelativeBias: the table has ", rows_, " rows, but q has ",
                sizes.heads, " heads; expected 1 row (every head) or one per query head");
  }

  template <class T>
  T operator()(T score, int64_t /*b*/, int64_t h, int64_t q_idx, int64_t kv_idx) const {
    const int64_t d = std::clamp(kv_idx - offset_ - q_idx, -max_distance_, max_distance_);
    return score + static_cast<T>(values_[(rows_ == 1 ? 0 : h) * (2 * max_distance_ + 1) + d + max_distance_]);
  }

 private:
  std::shared_ptr<const std::vector<double>> owner_;
  const double* values_ = nullptr;  // owner_'s data, [rows_, 2 * max_distance_ + 1]
  int64_t rows_ = 1;
  int64_t max_distance_ = 0;
  int64_t offset_ = 0;
};

}  // namespace torchattn::flex

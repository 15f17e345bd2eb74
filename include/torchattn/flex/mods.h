#pragma once

// What flex_attention (flex_attention.h) and create_block_mask (block_mask.h) take as
// mods: the signatures, checked where the user calls them (one compile error naming the
// expected signature, not pages from inside the kernels), and the sizes a mod that holds
// a table is checked against before a kernel reads it.
//
//   score_mod(auto score, int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx) -> score's type
//       called with float and double scores (the forward) and flex::Dual ones (the
//       backward, dual.h), so generic in the score;
//   mask_mod(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx) -> bool
//
// A mod that names `void check(const flex::ModSizes&) const` is checked against each
// call's sizes (flex::Alibi's slopes against the query heads, flex::RelativeBias's rows,
// flex::Documents's tokens against the lengths), an error naming both numbers.
//
// A mask_mod whose every query sees one run of keys may say so: a
// `flex::KeyRange keys(int64_t q_idx) const` (RangedMask) promises that query q_idx sees
// exactly the keys begin <= kv_idx < end, for every batch and head. create_block_mask
// then counts each block's keys from the runs instead of asking the mod per key, and the
// float32 forward computes a partial block's scores up to the last key its rows see and
// hides the rest by the runs (Causal, SlidingWindow, PrefixLM and Documents do).

#include <torchattn/flex/dual.h>

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <limits>
#include <type_traits>

// The texts of the signature checks (a static_assert takes a literal).
#define TORCHATTN_FLEX_SCORE_MOD_SIGNATURE                                                                       \
  "flex_attention: expected a score_mod callable as score_mod(auto score, int64_t b, int64_t h, int64_t q_idx, " \
  "int64_t kv_idx), const, returning the score's type, for float, double and flex::Dual scores (generic in the " \
  "score): [](auto score, int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx) { return score; }"
#define TORCHATTN_FLEX_MASK_MOD_SIGNATURE                                                                   \
  "flex: expected a mask_mod callable as mask_mod(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx) -> " \
  "bool, const: [](int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx) { return kv_idx <= q_idx; }"

namespace torchattn::flex {

/// Whether `ScoreMod` can change a score of type T.
template <class ScoreMod, class T>
concept ScoreModOf = requires(const ScoreMod& mod, T score, int64_t i) {
  { mod(score, i, i, i, i) } -> std::convertible_to<T>;
};

/// A score_mod: (auto score, int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx) -> the
/// score's type, for every score type the kernels run it on.
template <class ScoreMod>
inline constexpr bool is_score_mod = ScoreModOf<ScoreMod, float> && ScoreModOf<ScoreMod, double> &&
                                     ScoreModOf<ScoreMod, Dual<float>> && ScoreModOf<ScoreMod, Dual<double>>;

/// A mask_mod: (int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx) -> bool.
template <class MaskMod>
inline constexpr bool is_mask_mod = std::is_invocable_r_v<bool, const MaskMod&, int64_t, int64_t, int64_t, int64_t>;

/// The keys one query sees: begin <= kv_idx < end (end may pass the keys' length; an
/// empty run, begin >= end, sees none).
struct KeyRange {
  int64_t begin = 0;
  int64_t end = std::numeric_limits<int64_t>::max();

  /// The keys both runs hold.
  KeyRange operator&(const KeyRange& other) const { return {std::max(begin, other.begin), std::min(end, other.end)}; }
};

/// A mask_mod that names its run of keys per query (the file's comment): keys(q_idx)
/// must equal mask_mod(b, h, q_idx, .) for every b and h.
template <class MaskMod>
concept RangedMask = requires(const MaskMod& mod, int64_t i) {
  { mod.keys(i) } -> std::same_as<KeyRange>;
};

/// Named (::value) by every function that takes a score_mod: a class is instantiated
/// once per type, so a score_mod of another signature is one compile error, however
/// many functions it passes through, and none from the kernels (the functions then
/// instantiate nothing).
template <class ScoreMod>
struct CheckedScoreMod {
  static_assert(is_score_mod<ScoreMod>, TORCHATTN_FLEX_SCORE_MOD_SIGNATURE);
  static constexpr bool value = is_score_mod<ScoreMod>;
};

/// The same for a mask_mod (BlockMask<MaskMod> names it too).
template <class MaskMod>
struct CheckedMaskMod {
  static_assert(is_mask_mod<MaskMod>, TORCHATTN_FLEX_MASK_MOD_SIGNATURE);
  static constexpr bool value = is_mask_mod<MaskMod>;
};

/// The sizes a mod is used at: a flex_attention call's batch, query heads and lengths
/// (create_block_mask's B and H, 1 where the mask serves every one).
struct ModSizes {
  int64_t batch = 1;
  int64_t heads = 1;
  int64_t q_len = 0;
  int64_t kv_len = 0;
};

/// Calls mod.check(sizes) where the mod has one.
template <class Mod>
void check_mod(const Mod& mod, const ModSizes& sizes) {
  if constexpr (requires { mod.check(sizes); }) mod.check(sizes);
}

}  // namespace torchattn::flex

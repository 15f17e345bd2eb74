#pragma once

// Scores in SIMD lanes, for a score_mod that flex_attention's float32 forward may run on
// W keys at once (W: the lanes of the instruction set it runs, 16, 8 or 1) rather than
// key by key. A score_mod opts in by naming `kScoresInLanes` (the ready-made Softcap and
// Alibi do; flex::in_lanes(mod) marks a user's own), and is then called as
//
//   mod(Lanes<S> scores, int64_t b, int64_t h, int64_t q_idx, LaneIndex<S> kv_idx)
//
// where lane i holds the score of key kv_idx.base + i. So the mod must be generic in the
// index's type too: arithmetic with integers (kv_idx - q_idx), a cast to the score's type
// (static_cast<T>(kv_idx - q_idx): float lanes), and for the scores arithmetic with
// Lanes and numbers, tanh and abs called unqualified (as for flex::Dual, the backward's
// type). A mod that reads a table by index (RelativeBias) stays key by key.
//
// The lanes are floats in memory, not a vector register: a function of no target that
// passes a vector by value changes GCC's ABI (it warns in the translation unit that
// instantiates it); the kernel's compiler keeps them in registers once inlined.

#include <torchattn/flex/mods.h>
#include <torchattn/detail/kernels/cpu/simd.h>

#include <cstdint>
#include <type_traits>
#include <utility>

TORCHATTN_SIMD_KERNELS_BEGIN

namespace torchattn::flex {

/// The keys of a lane group: lane i is base + step * i (step 1 for kv_idx).
template <class S>
struct LaneIndex {
  int64_t base;
  int64_t step = 1;
};

template <class S, class I>
  requires std::is_integral_v<I>
LaneIndex<S> operator+(LaneIndex<S> a, I c) {
  return {a.base + static_cast<int64_t>(c), a.step};
}
template <class S, class I>
  requires std::is_integral_v<I>
LaneIndex<S> operator+(I c, LaneIndex<S> a) {
  return a + c;
}
template <class S, class I>
  requires std::is_integral_v<I>
LaneIndex<S> operator-(LaneIndex<S> a, I c) {
  return {a.base - static_cast<int64_t>(c), a.step};
}
template <class S, class I>
  requires std::is_integral_v<I>
LaneIndex<S> operator-(I c, LaneIndex<S> a) {
  return {static_cast<int64_t>(c) - a.base, -a.step};
}
template <class S>
LaneIndex<S> operator-(LaneIndex<S> a) {
  return {-a.base, -a.step};
}
template <class S, class I>
  requires std::is_integral_v<I>
LaneIndex<S> operator*(I c, LaneIndex<S> a) {
  return {static_cast<int64_t>(c) * a.base, static_cast<int64_t>(c) * a.step};
}
template <class S, class I>
  requires std::is_integral_v<I>
LaneIndex<S> operator*(LaneIndex<S> a, I c) {
  return c * a;
}

/// W float scores (see the file's comment).
template <class S>
struct Lanes {
  float x[S::W];

  Lanes() = default;
  /// Every lane `value` (a constant).
  template <class U>
    requires std::is_arithmetic_v<U>
  Lanes(U value) {  // NOLINT(google-explicit-constructor): as a score's type is made from numbers
    S::store(x, S::set1(static_cast<float>(value)));
  }
  /// Lane i: float(index.base + index.step * i), exact below 2^24.
  explicit Lanes(const LaneIndex<S>& index) {
    S::store(x, S::fma(S::iota(0), S::set1(static_cast<float>(index.step)), S::set1(static_cast<float>(index.base))));
  }
};

#define TORCHATTN_FLEX_LANES_OPERATOR(op, fn)                  \
  template <class S>                                           \
  Lanes<S> operator op(const Lanes<S>& a, const Lanes<S>& b) { \
    Lanes<S> r;                                                \
    S::store(r.x, S::fn(S::load(a.x), S::load(b.x)));          \
    return r;                                                  \
  }                                                            \
  template <class S, class U>                                  \
    requires std::is_arithmetic_v<U>                           \
  Lanes<S> operator op(const Lanes<S>& a, U b) {               \
    return a op Lanes<S>(b);                                   \
  }                                                            \
  template <class S, class U>                                  \
    requires std::is_arithmetic_v<U>                           \
  Lanes<S> operator op(U a, const Lanes<S>& b) {               \
    return Lanes<S>(a) op b;                                   \
  }
TORCHATTN_FLEX_LANES_OPERATOR(+, add)
TORCHATTN_FLEX_LANES_OPERATOR(-, sub)
TORCHATTN_FLEX_LANES_OPERATOR(*, mul)
TORCHATTN_FLEX_LANES_OPERATOR(/, div)
#undef TORCHATTN_FLEX_LANES_OPERATOR

template <class S>
Lanes<S> operator-(const Lanes<S>& a) {
  return Lanes<S>(0.0f) - a;
}
template <class S>
Lanes<S> tanh(const Lanes<S>& a) {
  Lanes<S> r;
  S::store(r.x, S::tanh(S::load(a.x)));
  return r;
}
template <class S>
Lanes<S> abs(const Lanes<S>& a) {
  Lanes<S> r;
  S::store(r.x, S::abs(S::load(a.x)));
  return r;
}

/// Whether flex_attention's forward runs score_mod on Lanes (it names kScoresInLanes true).
template <class ScoreMod, class = void>
inline constexpr bool runs_in_lanes = false;
template <class ScoreMod>
inline constexpr bool runs_in_lanes<ScoreMod, std::void_t<decltype(ScoreMod::kScoresInLanes)>> =
    ScoreMod::kScoresInLanes;

/// A user's score_mod marked for Lanes: it must take its kv_idx (and its score) generic,
/// as the file's comment says.
template <class ScoreMod>
struct InLanes {
  static constexpr bool kScoresInLanes = true;
  ScoreMod mod;
  template <class T, class I>
  auto operator()(T score, int64_t b, int64_t h, int64_t q_idx, I kv_idx) const {
    return mod(score, b, h, q_idx, kv_idx);
  }
  void check(const ModSizes& sizes) const { check_mod(mod, sizes); }
};

/// score_mod, run W keys at a time by the float32 forward: `[](auto score, int64_t b,
/// int64_t h, int64_t q_idx, auto kv_idx) { ... }`.
template <class ScoreMod>
InLanes<ScoreMod> in_lanes(ScoreMod mod) {
  return {std::move(mod)};
}

}  // namespace torchattn::flex

TORCHATTN_SIMD_KERNELS_END

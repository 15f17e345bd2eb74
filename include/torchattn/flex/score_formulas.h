#pragma once

// The formulas of the library's named score variants, written once: flex::Softcap and
// flex::Alibi (variants.h) call them, and so does a user's flex variant composed with the
// module's own softcap and ALiBi (flex::ScoreAtPositions, flex_attention.h). Generic in
// the score (float, double, flex::Dual, flex::Lanes) and in the key's index (int64_t, or
// flex::LaneIndex for W keys at once).

#include <c10/util/Exception.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace torchattn::flex {

/// Logit softcapping (Gemma 2): cap * tanh(score / cap), in (-cap, cap), in the score's
/// type.
template <class T>
T softcapped(T score, double cap) {
  using std::tanh;  // unqualified: Lanes and Dual scores have their own
  const T c = static_cast<T>(cap);
  return c * tanh(score / c);
}

/// ALiBi: score + slope * (kv_idx - position), the query standing at `position`; the
/// slope and the distance in the score's type (float32 for float32, as the library's
/// alibi_bias).
template <class T, class I>
T with_alibi(T score, double slope, int64_t position, I kv_idx) {
  return score + static_cast<T>(slope) * static_cast<T>(kv_idx - position);
}

/// ALiBi's slopes against q's heads: one per query head, else an error of `who` naming
/// both counts.
inline void check_alibi_slopes(size_t slopes, int64_t heads, const char* who) {
  TORCH_CHECK(static_cast<int64_t>(slopes) >= heads, who, ": has ", slopes, " slopes, but q has ", heads,
              " heads; expected one slope per query head");
}

}  // namespace torchattn::flex

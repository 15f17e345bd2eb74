#pragma once

// The softmax of one attention row, shared by the CPU attention kernels (decode,
// prefill, paged) and written once over the vector types of simd.h. It is online: a
// row's scores may come in blocks of keys, with the running max and the running sum
// carried from one block to the next, as flash attention carries them.
//
//   RowSoftmax<S> row;                        // max -inf, sum 0
//   row.add_sink(logit);                      // optional, before the keys: a logit with no value
//   const float rescale = row.add(s, n);      // s[0, n): scores in, numerators out
//   out = out * rescale + sum_j s[j] v[j];    // the caller's weighted values
//   ... more blocks ...
//   out *= row.inverse();                     // 1 / sum; 0 for a row that saw nothing
//
// add() turns the block's scores into numerators exp(s - max), max the largest score so
// far (a score of -inf, or more than 87 below the max, gives exactly 0), adds them to the
// sum in W-lane accumulators, key j into lane j % W from key 0, and returns the factor
// exp(old max - new max) by which what was accumulated against the old max must be
// multiplied (1 where the max did not grow; 0 before anything was added). A score of
// NaN or +inf makes the sum NaN (as ATen's softmax gives NaN), so the row's output
// shows it rather than a weight the polynomial exp clamped: the scores are summed
// beside their numerators (a NaN among them makes that sum NaN), and +inf is the max.
// With the whole row in one block the numbers are those of the two-pass softmax: the
// row's max, then exp(s - max) and their sum in that lane order.

#include <torchattn/detail/kernels/cpu/simd.h>

#include <cmath>
#include <cstdint>
#include <limits>

TORCHATTN_SIMD_KERNELS_BEGIN

namespace torchattn::kernels::cpu {

template <class S>
struct RowSoftmax {
  /// Below max - 87 a numerator is 0 (exp(-87) is 1.6e-38, near the smallest normal float).
  static constexpr float kFloor = -87.0f;

  float max = simd::kNegInf;
  float sum = 0.0f;

  /// A logit that joins the max and the sum but has no value (an attention sink): its
  /// exp(logit - max) is added to the sum. Call it before the first block.
  void add_sink(float logit) {
    max = logit;
    sum = 1.0f;
  }

  /// s[0, n): the block's scores in, their numerators out. Returns the factor for what
  /// was accumulated before this block (see above).
  float add(float* s, int64_t n) {
    using V = typename S::V;
    constexpr int W = S::W;
    const int64_t whole = n / W * W;  // whole vectors; the tail's lanes past n read as -inf
    const int tail = static_cast<int>(n - whole);
    V top = S::set1(simd::kNegInf);
    for (int64_t j = 0; j < whole; j += W) top = S::max(top, S::load(s + j));
    if (tail > 0) top = S::max(top, S::load_or(s + whole, tail, simd::kNegInf));
    const float block_max = S::reduce_max(top);
    const float new_max = block_max > max ? block_max : max;
    const float rescale = max == simd::kNegInf ? 0.0f : (new_max == max ? 1.0f : std::exp(max - new_max));
    const V m = S::set1(new_max);
    // A score more than kFloor below the max weighs 0 (the polynomial exp clamps there,
    // and libm's gives a subnormal at most): its value is never read. A score of -inf
    // always: where the max is -inf too, every score is.
    const bool hidden = new_max == simd::kNegInf;
    V total = S::zero(), scores = S::zero();  // scores: their sum, NaN where one is NaN
    for (int64_t j = 0; j < whole; j += W) {
      const V x = S::load(s + j);
      const V d = S::sub(x, m);
      const V p = hidden ? S::zero() : S::below(d, kFloor, S::zero(), S::exp_neg(d));
      S::store(s + j, p);
      total = S::add(total, p);
      scores = S::add(scores, x);
    }
    if (tail > 0) {  // the same, over the tail's lanes
      const V x = S::load_or(s + whole, tail, simd::kNegInf);
      const V d = S::sub(x, m);
      const V p = hidden ? S::zero() : S::below(d, kFloor, S::zero(), S::exp_neg(d));
      S::store(s + whole, p, tail);
      total = S::add(total, p);
      scores = S::add(scores, x);
    }
    const bool odd = std::isnan(S::reduce_add(scores)) || block_max == std::numeric_limits<float>::infinity();
    sum = odd ? std::numeric_limits<float>::quiet_NaN() : sum * rescale + S::reduce_add(total);
    max = new_max;
    return rescale;
  }

  /// 1 / sum, or 0 where every score was -inf (the row's output stays zeros); NaN
  /// after a score of NaN or +inf.
  float inverse() const { return sum == 0.0f ? 0.0f : 1.0f / sum; }
};

}  // namespace torchattn::kernels::cpu

TORCHATTN_SIMD_KERNELS_END

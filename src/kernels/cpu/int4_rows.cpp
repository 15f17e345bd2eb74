#include "kernels/cpu/int4_rows.h"

#include <torchattn/detail/kernels/cpu/simd.h>

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

TORCHATTN_SIMD_KERNELS_BEGIN

namespace torchattn::kernels::cpu {

// The helpers in int4's own namespace: a unity build puts this file beside the int8
// kernels' (whose names they share).
namespace int4 {
namespace {

constexpr int64_t kGroup = kInt4Group;
constexpr int64_t kGroupBytes = kGroup / 2;
// Groups whose (d, m) are widened to floats at once, per weight row (on the stack).
constexpr int64_t kChunk = 64;
// Rows of x the few-rows kernels take at once (four_rows_at_a_time).
constexpr int64_t kFourRowsX = 16;

uint16_t half_bits(float v) { return c10::Half(v).x; }

// out[0, n) = the float16 values at p (their bits) as floats.
template <class S>
void widen_halves(const uint16_t* p, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + S::W <= n; i += S::W) S::store(out + i, S::widen_halves(p + i));
  for (; i < n; ++i) out[i] = simd::Scalar::widen_halves(p + i);
}

// One row's groups: data bytes (16 a group) and (d, m) pairs.
struct Dequantize {
  static constexpr Isa kWidest = Isa::Avx512;
  template <class S>
  static void run(const uint8_t* q, const uint16_t* dm, int64_t groups, float* out) {
    alignas(64) float f[2 * kChunk];
    for (int64_t g0 = 0; g0 < groups; g0 += kChunk) {
      const int64_t n = std::min(kChunk, groups - g0);
      widen_halves<S>(dm + 2 * g0, 2 * n, f);
      for (int64_t g = 0; g < n; ++g) {
        const uint8_t* b = q + (g0 + g) * kGroupBytes;
        float* o = out + (g0 + g) * kGroup;
        const typename S::V d = S::set1(f[2 * g]), m = S::set1(f[2 * g + 1]);
        for (int64_t j = 0; j < kGroupBytes; j += S::W) {
          S::store(o + j, S::fma(S::widen_low_nibbles(b + j), d, m));
          S::store(o + kGroupBytes + j, S::fma(S::widen_high_nibbles(b + j), d, m));
        }
      }
    }
  }
};

// out[k] = the int4 product of weight rows q[k], dm[k] (k < 4) with one row of x (sx
// its group sums): per group, two vector accumulators' worth of products a row, folded
// into the row's total by the group's d; m times sx summed apart.
struct DotFour {
  static constexpr Isa kWidest = Isa::Avx512;
  template <class S>
  static void run(const uint8_t* const* q, const uint16_t* const* dm, const float* x, const float* sx, int64_t groups,
                  float* out) {
    using V = typename S::V;
    V t[4] = {S::zero(), S::zero(), S::zero(), S::zero()};
    float offsets[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    alignas(64) float f[4][2 * kChunk];
    for (int64_t g0 = 0; g0 < groups; g0 += kChunk) {
      const int64_t n = std::min(kChunk, groups - g0);
      for (int k = 0; k < 4; ++k) widen_halves<S>(dm[k] + 2 * g0, 2 * n, f[k]);
      for (int64_t g = 0; g < n; ++g) {
        const float* xg = x + (g0 + g) * kGroup;
        const int64_t at = (g0 + g) * kGroupBytes;
        V a[4] = {S::zero(), S::zero(), S::zero(), S::zero()};
        for (int64_t j = 0; j < kGroupBytes; j += S::W) {
          const V lo = S::load(xg + j), hi = S::load(xg + kGroupBytes + j);
          for (int k = 0; k < 4; ++k) {
            a[k] = S::fma(S::widen_low_nibbles(q[k] + at + j), lo, a[k]);
            a[k] = S::fma(S::widen_high_nibbles(q[k] + at + j), hi, a[k]);
          }
        }
        const float s = sx[g0 + g];
        for (int k = 0; k < 4; ++k) {
          t[k] = S::fma(a[k], S::set1(f[k][2 * g]), t[k]);
          offsets[k] = std::fma(f[k][2 * g + 1], s, offsets[k]);
        }
      }
    }
    for (int k = 0; k < 4; ++k) out[k] = S::reduce_add(t[k]) + offsets[k];
  }
};

// One row quantized as int4_rows.h says; false where it holds a NaN or an infinity, or
// a group float16 cannot hold.
bool quantize_row(const float* w, int64_t in, uint8_t* q, uint16_t* dm) {
  uint8_t values[kGroup];
  for (int64_t g0 = 0, g = 0; g0 < in; g0 += kGroup, ++g) {
    const float* wg = w + g0;
    float lo = wg[0], hi = wg[0];
    bool finite = true;
    for (int64_t i = 0; i < kGroup; ++i) {
      finite = finite && std::isfinite(wg[i]);
      lo = std::min(lo, wg[i]);
      hi = std::max(hi, wg[i]);
    }
    if (!finite) return false;
    const uint16_t d_bits = half_bits((hi - lo) / 15.0f), m_bits = half_bits(lo);
    const float d = simd::Scalar::widen_halves(&d_bits), m = simd::Scalar::widen_halves(&m_bits);
    if (!std::isfinite(d) || !std::isfinite(m)) return false;
    for (int64_t i = 0; i < kGroup; ++i) {
      const float r = d > 0.0f ? simd::Scalar::round((wg[i] - m) / d) : 0.0f;
      values[i] = static_cast<uint8_t>(std::clamp(r, 0.0f, 15.0f));
    }
    for (int64_t j = 0; j < kGroupBytes; ++j) {
      q[g * kGroupBytes + j] = static_cast<uint8_t>(values[j] | (values[j + kGroupBytes] << 4));
    }
    dm[2 * g] = d_bits;
    dm[2 * g + 1] = m_bits;
  }
  return true;
}

// One row quantized as quantize_row does, to the same bits, W lanes at a time: a chunk
// of groups' least and largest values (exact in any order; where one is a zero, the sign
// of the first such zero in the group, as the loop above keeps it), their (d, m) made
// float16 together, then each group's values. A NaN or an infinity: false.
struct QuantizeGroups {
  static constexpr Isa kWidest = Isa::Avx512;
  template <class S>
  static bool run(const float* w, int64_t in, uint8_t* q, uint16_t* dm) {
    if constexpr (S::W == 1 || kGroup % S::W != 0) {
      return quantize_row(w, in, q, dm);
    } else {
      using V = typename S::V;
      alignas(64) float f[2 * kChunk];
      alignas(64) float wide[2 * kChunk];
      alignas(64) uint8_t values[kGroup];
      const int64_t groups = in / kGroup;
      const auto first_zero = [](const float* wg) {
        for (int64_t i = 0; i < kGroup; ++i) {
          if (wg[i] == 0.0f) return wg[i];
        }
        return 0.0f;
      };
      for (int64_t g0 = 0; g0 < groups; g0 += kChunk) {
        const int64_t n = std::min(kChunk, groups - g0);
        for (int64_t g = 0; g < n; ++g) {
          const float* wg = w + (g0 + g) * kGroup;
          V lo = S::load(wg), hi = lo, bad = S::mul(lo, S::zero());
          for (int64_t i = S::W; i < kGroup; i += S::W) {
            const V v = S::load(wg + i);
            bad = S::add(bad, S::mul(v, S::zero()));
            lo = S::min(lo, v);
            hi = S::max(hi, v);
          }
          if (S::reduce_add(bad) != 0.0f) return false;  // NaN: a NaN or an infinity
          float least = -S::reduce_max(S::sub(S::zero(), lo)), most = S::reduce_max(hi);
          if (least == 0.0f) least = first_zero(wg);
          if (most == 0.0f) most = first_zero(wg);
          f[2 * g] = (most - least) / 15.0f;
          f[2 * g + 1] = least;
        }
        uint16_t* dmc = dm + 2 * g0;
        int64_t i = 0;
        for (; i + S::W <= 2 * n; i += S::W) S::narrow_halves(dmc + i, S::load(f + i));
        for (; i < 2 * n; ++i) simd::Scalar::narrow_halves(dmc + i, f[i]);
        widen_halves<S>(dmc, 2 * n, wide);
        for (int64_t g = 0; g < n; ++g) {
          const float d = wide[2 * g], m = wide[2 * g + 1];
          if (!std::isfinite(d) || !std::isfinite(m)) return false;
          const float* wg = w + (g0 + g) * kGroup;
          if (d > 0.0f) {
            const V dv = S::set1(d), mv = S::set1(m), top = S::set1(15.0f);
            for (int64_t j = 0; j < kGroup; j += S::W) {
              const V r = S::round(S::div(S::sub(S::load(wg + j), mv), dv));
              S::narrow(values + j, S::max(S::min(r, top), S::zero()), static_cast<int>(S::W));
            }
          } else {
            std::memset(values, 0, sizeof values);
          }
          uint8_t* qg = q + (g0 + g) * kGroupBytes;
          for (int64_t j = 0; j < kGroupBytes; ++j) {
            qg[j] = static_cast<uint8_t>(values[j] | (values[j + kGroupBytes] << 4));
          }
        }
      }
      return true;
    }
  }
};

// The int8 products of four weight rows with one quantized row of x (int4_rows.h): the
// portable loop, a group at a time.
void products_four_portable(const uint8_t* const* q, const uint16_t* const* dm, const int8_t* qx, const float* sp,
                            int64_t groups, float* out) {
  for (int k = 0; k < 4; ++k) {
    float acc = 0.0f, offsets = 0.0f;
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* b = q[k] + g * kGroupBytes;
      const int8_t* xg = qx + g * kGroup;
      int32_t sum = 0;
      for (int64_t j = 0; j < kGroupBytes; ++j) sum += (b[j] & 15) * xg[j] + (b[j] >> 4) * xg[kGroupBytes + j];
      const float d = simd::Scalar::widen_halves(dm[k] + 2 * g), m = simd::Scalar::widen_halves(dm[k] + 2 * g + 1);
      acc = std::fma(static_cast<float>(sum), d * sp[2 * g], acc);
      offsets = std::fma(m, sp[2 * g + 1], offsets);
    }
    out[k] = acc + offsets;
  }
}

// One row of quantized x for products_rows_avx2 and pair_vnni: each pair of groups (g,
// g + 1) as g's first 16 bytes, g + 1's first 16, g's last 16, g + 1's last 16 (an odd last group as it is).
void pair_inputs(const int8_t* qx, int64_t in, int8_t* out) {
  const int64_t groups = in / kGroup;
  int64_t g = 0;
  for (; g + 2 <= groups; g += 2) {
    const int8_t* a = qx + g * kGroup;
    int8_t* o = out + g * kGroup;
    std::memcpy(o, a, 16);
    std::memcpy(o + 16, a + kGroup, 16);
    std::memcpy(o + 32, a + 16, 16);
    std::memcpy(o + 48, a + kGroup + 16, 16);
  }
  if (g < groups) std::memcpy(out + g * kGroup, qx + g * kGroup, kGroup);
}

TORCHATTN_SIMD_TARGETS_BEGIN
#if defined(TORCHATTN_SIMD_X86)
// One group of one weight row against x's 32 bytes: its 16 bytes become one register of
// 32 (the low nibbles, then the high: the group's inputs in order), vpmaddubsw against
// x (unsigned 4-bit values times signed bytes, pairs summed in int16: at most 2 * 15 *
// 127), vpmaddwd into eight int32 lanes, then float lanes times d s into acc.
__attribute__((target("avx2,fma,f16c"), always_inline)) inline __m256 group_avx2(const uint8_t* b, __m256i xv,
                                                                                 const float* ds, __m256 acc) {
  const __m128i low = _mm_set1_epi8(15);
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
  const __m256i w = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(bytes, 4), low), _mm_and_si128(bytes, low));
  const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(w, xv), _mm256_set1_epi16(1));
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(ds), acc);
}

__attribute__((target("avx2,fma,f16c"), always_inline)) inline float sum_avx2(__m256 v) {
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 p = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(p, _mm_shuffle_ps(p, p, 1)));
}

// Per chunk of groups, each row's (d, m) pairs times x's (s, sum) pairs (sp) in vector
// registers: ds[k] the (d s, m sum) pairs, m_sums[k] gathering the m sums' lanes (the
// last pairs of a chunk not in a register: in offsets[k]).
constexpr int64_t kScaleSlack = 16;  // floats readable past a chunk's pairs (vector loads)

__attribute__((target("avx2,fma,f16c"), always_inline)) inline void scales_avx2(const uint16_t* const* dm,
                                                                                const float* sp, int64_t g0, int64_t n,
                                                                                float (*ds)[2 * kChunk + kScaleSlack],
                                                                                __m256* m_sums, float* offsets) {
  const __m256 odd = _mm256_castsi256_ps(_mm256_setr_epi32(0, -1, 0, -1, 0, -1, 0, -1));
  for (int k = 0; k < 4; ++k) {
    int64_t i = 0;
    for (; i + 8 <= 2 * n; i += 8) {
      const __m256 f = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dm[k] + 2 * g0 + i)));
      const __m256 p = _mm256_mul_ps(f, _mm256_loadu_ps(sp + 2 * g0 + i));
      _mm256_store_ps(ds[k] + i, p);
      m_sums[k] = _mm256_add_ps(m_sums[k], _mm256_and_ps(p, odd));
    }
    for (; i < 2 * n; ++i) {
      ds[k][i] = simd::Scalar::widen_halves(dm[k] + 2 * g0 + i) * sp[2 * g0 + i];
      if (i % 2 == 1) offsets[k] += ds[k][i];
    }
  }
}

// Four weight rows' (d, m) pairs of groups [g0, g0 + n) as floats, transposed: dq[g] the
// four rows' d of group g0 + g, mq[g] their m. Four groups at a time: each row's eight
// halves widened (F16C), then unpacked and shuffled across the rows.
__attribute__((target("avx2,fma,f16c"), always_inline)) inline void four_rows_scales(const uint16_t* const* dm,
                                                                                     int64_t g0, int64_t n,
                                                                                     float (*dq)[4], float (*mq)[4]) {
  int64_t g = 0;
  for (; g + 4 <= n; g += 4) {
    __m256 r[4];
    for (int k = 0; k < 4; ++k) {
      r[k] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dm[k] + 2 * (g0 + g))));
    }
    // Per 128-bit half (groups g, g + 1 | g + 2, g + 3): [d0 d1 m0 m1] of the even group, of the odd.
    const __m256 even01 = _mm256_unpacklo_ps(r[0], r[1]), even23 = _mm256_unpacklo_ps(r[2], r[3]);
    const __m256 odd01 = _mm256_unpackhi_ps(r[0], r[1]), odd23 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 d_even = _mm256_shuffle_ps(even01, even23, 0x44), m_even = _mm256_shuffle_ps(even01, even23, 0xee);
    const __m256 d_odd = _mm256_shuffle_ps(odd01, odd23, 0x44), m_odd = _mm256_shuffle_ps(odd01, odd23, 0xee);
    _mm_store_ps(dq[g], _mm256_castps256_ps128(d_even));
    _mm_store_ps(dq[g + 1], _mm256_castps256_ps128(d_odd));
    _mm_store_ps(dq[g + 2], _mm256_extractf128_ps(d_even, 1));
    _mm_store_ps(dq[g + 3], _mm256_extractf128_ps(d_odd, 1));
    _mm_store_ps(mq[g], _mm256_castps256_ps128(m_even));
    _mm_store_ps(mq[g + 1], _mm256_castps256_ps128(m_odd));
    _mm_store_ps(mq[g + 2], _mm256_extractf128_ps(m_even, 1));
    _mm_store_ps(mq[g + 3], _mm256_extractf128_ps(m_odd, 1));
  }
  for (; g < n; ++g) {
    for (int k = 0; k < 4; ++k) {
      dq[g][k] = simd::Scalar::widen_halves(dm[k] + 2 * (g0 + g));
      mq[g][k] = simd::Scalar::widen_halves(dm[k] + 2 * (g0 + g) + 1);
    }
  }
}

// One group's step of products_four_portable for four weight rows at once, in its
// float32 operations: sums the four rows' int32 products of the group, then
// acc = fma(float(sum), d s, acc) and offsets = fma(m, sq, offsets) lane by lane.
__attribute__((target("avx2,fma,f16c"), always_inline)) inline void group_step(__m128i sums, const float* d,
                                                                               const float* m, const float* sp,
                                                                               __m128& acc, __m128& offsets) {
  acc = _mm_fmadd_ps(_mm_cvtepi32_ps(sums), _mm_mul_ps(_mm_load_ps(d), _mm_broadcast_ss(sp)), acc);
  offsets = _mm_fmadd_ps(_mm_load_ps(m), _mm_broadcast_ss(sp + 1), offsets);
}

// products_four_portable with AVX2 for `rows` rows of x at once (qx as pair_inputs
// leaves each row, in bytes apart; sp each row's pairs, 2 * groups apart), the same
// float32 operations in the same order, so the same bits: out[4 r + k] is weight row k's
// product with row r. Each pair of groups of the four weight rows is unpacked once (32
// bytes: the low nibbles, g's inputs 0-15 then g + 1's, and the high, 16-31) for every
// row of x; per row, vpmaddubsw against x's two halves (the int16 pairs added: at most
// 4 * 15 * 127), vpmaddwd into eight int32 lanes (g's four, g + 1's four), and three
// vphaddd leave each weight row's sum of g and of g + 1 in the lanes of one register.
// Two to sixteen rows of x read each weight once and scale four outputs per
// instruction: 16 rows of SmolLM2-135M's layers in 0.50-0.57x the time of the kernel it
// replaced (one weight row against one row of x at a time), one row 0.95x; the 1B-shaped
// model's layers 0.71x at 16 rows, 0.87x at one (a 2-core AMD EPYC Zen 3, AVX2 without
// VNNI, 2 threads, medians of 21 interleaved pairs).
template <bool kOneRow>
__attribute__((target("avx2,fma,f16c"))) void products_rows_avx2(const uint8_t* const* q, const uint16_t* const* dm,
                                                                 const int8_t* qx, const float* sp, int64_t rows_in,
                                                                 int64_t in, float* out) {
  const int64_t rows = kOneRow ? 1 : rows_in;  // one: the sums kept in registers
  const int64_t groups = in / kGroup;
  alignas(16) float dq[kChunk][4];
  alignas(16) float mq[kChunk][4];
  __m128 acc[kFourRowsX], offsets[kFourRowsX];
  for (int64_t r = 0; r < rows; ++r) acc[r] = offsets[r] = _mm_setzero_ps();
  const __m256i low = _mm256_set1_epi8(15);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t g0 = 0; g0 < groups; g0 += kChunk) {
    const int64_t n = std::min(kChunk, groups - g0);
    four_rows_scales(dm, g0, n, dq, mq);
    int64_t g = 0;
    for (; g + 2 <= n; g += 2) {
      const int64_t at = (g0 + g) * kGroupBytes;
      __m256i lo[4], hi[4];
      for (int k = 0; k < 4; ++k) {
        const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q[k] + at));
        lo[k] = _mm256_and_si256(bytes, low);
        hi[k] = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low);
      }
      for (int64_t r = 0; r < rows; ++r) {
        const int8_t* xg = qx + r * in + (g0 + g) * kGroup;
        const __m256i xlo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xg));
        const __m256i xhi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xg + 32));
        __m256i v[4];
        for (int k = 0; k < 4; ++k) {
          v[k] = _mm256_add_epi16(_mm256_maddubs_epi16(lo[k], xlo), _mm256_maddubs_epi16(hi[k], xhi));
        }
        const __m256i sums = _mm256_madd_epi16(_mm256_hadd_epi16(_mm256_hadd_epi16(v[0], v[1]),
                                                                 _mm256_hadd_epi16(v[2], v[3])),
                                               ones);
        const float* s = sp + 2 * (r * groups + g0 + g);
        group_step(_mm256_castsi256_si128(sums), dq[g], mq[g], s, acc[r], offsets[r]);
        group_step(_mm256_extracti128_si256(sums, 1), dq[g + 1], mq[g + 1], s + 2, acc[r], offsets[r]);
      }
    }
    if (g < n) {  // an odd last group, its x in order
      const int64_t at = (g0 + g) * kGroupBytes;
      __m128i lo[4], hi[4];
      for (int k = 0; k < 4; ++k) {
        const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q[k] + at));
        lo[k] = _mm_and_si128(bytes, _mm256_castsi256_si128(low));
        hi[k] = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm256_castsi256_si128(low));
      }
      for (int64_t r = 0; r < rows; ++r) {
        const int8_t* xg = qx + r * in + (g0 + g) * kGroup;
        const __m128i xlo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(xg));
        const __m128i xhi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(xg + 16));
        __m128i v[4];
        for (int k = 0; k < 4; ++k) {
          v[k] = _mm_add_epi16(_mm_maddubs_epi16(lo[k], xlo), _mm_maddubs_epi16(hi[k], xhi));
        }
        const __m128i sums = _mm_madd_epi16(_mm_hadd_epi16(_mm_hadd_epi16(v[0], v[1]), _mm_hadd_epi16(v[2], v[3])),
                                            _mm256_castsi256_si128(ones));
        group_step(sums, dq[g], mq[g], sp + 2 * (r * groups + g0 + g), acc[r], offsets[r]);
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) _mm_storeu_ps(out + 4 * r, _mm_add_ps(acc[r], offsets[r]));
}

#define TORCHATTN_INT4_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")))

// Two groups of one weight row against 64 bytes of x with AVX-512 VNNI: their 32 bytes
// as [b | b >> 4] masked to 4 bits (128-bit lanes: g's low values, g + 1's, g's high,
// g + 1's), against x's bytes in that order (pair_inputs), vpdpbusd into sixteen int32
// lanes, then float lanes times their group's d s.
TORCHATTN_INT4_VNNI __attribute__((always_inline)) inline __m512 pair_vnni(const uint8_t* b, __m512i xv,
                                                                           const float* ds, __m512 acc) {
  const __m512i z = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
  const __m512i shifts = _mm512_setr_epi64(0, 0, 0, 0, 0x0004000400040004, 0x0004000400040004, 0x0004000400040004,
                                           0x0004000400040004);
  const __m512i w = _mm512_and_si512(_mm512_srlv_epi16(z, shifts), _mm512_set1_epi8(15));
  const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, xv);
  const __m512i pick = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0, 2, 2, 2, 2);
  const __m512 scale = _mm512_permutexvar_ps(pick, _mm512_loadu_ps(ds));
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, acc);
}

// products_four_portable's sums with AVX-512 VNNI, within float32 rounding of them (two
// groups' d s in sixteen lanes, the lanes summed at the end): two groups a step (an odd
// last group in eight lanes); qx as pair_inputs leaves it.
TORCHATTN_INT4_VNNI void products_four_vnni(const uint8_t* const* q, const uint16_t* const* dm, const int8_t* qx,
                                            const float* sp, int64_t groups, float* out) {
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
  __m256 t0 = _mm256_setzero_ps(), t1 = _mm256_setzero_ps(), t2 = _mm256_setzero_ps(), t3 = _mm256_setzero_ps();
  __m256 m_sums[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  float offsets[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  alignas(64) float ds[4][2 * kChunk + kScaleSlack];
  for (int64_t g0 = 0; g0 < groups; g0 += kChunk) {
    const int64_t n = std::min(kChunk, groups - g0);
    scales_avx2(dm, sp, g0, n, ds, m_sums, offsets);
    const uint8_t* b0 = q[0] + g0 * kGroupBytes;
    const uint8_t* b1 = q[1] + g0 * kGroupBytes;
    const uint8_t* b2 = q[2] + g0 * kGroupBytes;
    const uint8_t* b3 = q[3] + g0 * kGroupBytes;
    const int8_t* xg = qx + g0 * kGroup;
    int64_t g = 0;
    for (; g + 2 <= n; g += 2) {
      const __m512i xv = _mm512_loadu_si512(xg + g * kGroup);
      a0 = pair_vnni(b0 + g * kGroupBytes, xv, ds[0] + 2 * g, a0);
      a1 = pair_vnni(b1 + g * kGroupBytes, xv, ds[1] + 2 * g, a1);
      a2 = pair_vnni(b2 + g * kGroupBytes, xv, ds[2] + 2 * g, a2);
      a3 = pair_vnni(b3 + g * kGroupBytes, xv, ds[3] + 2 * g, a3);
    }
    if (g < n) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xg + g * kGroup));
      t0 = group_avx2(b0 + g * kGroupBytes, xv, ds[0] + 2 * g, t0);
      t1 = group_avx2(b1 + g * kGroupBytes, xv, ds[1] + 2 * g, t1);
      t2 = group_avx2(b2 + g * kGroupBytes, xv, ds[2] + 2 * g, t2);
      t3 = group_avx2(b3 + g * kGroupBytes, xv, ds[3] + 2 * g, t3);
    }
  }
  out[0] = _mm512_reduce_add_ps(a0) + sum_avx2(t0) + (sum_avx2(m_sums[0]) + offsets[0]);
  out[1] = _mm512_reduce_add_ps(a1) + sum_avx2(t1) + (sum_avx2(m_sums[1]) + offsets[1]);
  out[2] = _mm512_reduce_add_ps(a2) + sum_avx2(t2) + (sum_avx2(m_sums[2]) + offsets[2]);
  out[3] = _mm512_reduce_add_ps(a3) + sum_avx2(t3) + (sum_avx2(m_sums[3]) + offsets[3]);
}
#undef TORCHATTN_INT4_VNNI

#endif
TORCHATTN_SIMD_TARGETS_END

bool dense_cpu(const at::Tensor& t, int64_t dim) {
  return t.defined() && t.is_cpu() && t.layout() == at::kStrided && !t.is_nested() && t.dim() == dim &&
         t.is_contiguous();
}

}  // namespace
}  // namespace int4

std::pair<at::Tensor, at::Tensor> quantize_int4_groups(const at::Tensor& weight_in) {
  return quantize_int4_groups(weight_in, best_isa());
}

std::pair<at::Tensor, at::Tensor> quantize_int4_groups(const at::Tensor& weight_in, Isa isa) {
  check_isa_at_most(isa, best_isa(), "quantize_int4_groups");
  TORCH_CHECK(weight_in.dim() == 2 && weight_in.scalar_type() == at::kFloat,
              "quantize_int4_groups: expected a float32 weight [out, in], got ", weight_in.sizes(), " of ",
              weight_in.scalar_type());
  TORCH_CHECK(weight_in.size(1) % kInt4Group == 0, "int4 weights take layers whose inputs are a multiple of ",
              kInt4Group, " (groups of ", kInt4Group, " share a scale), got in_features ", weight_in.size(1),
              " (int8 takes any number)");
  const at::Tensor weight = weight_in.contiguous();
  const int64_t out = weight.size(0), in = weight.size(1), groups = in / kInt4Group;
  at::Tensor data = at::empty({out, in / 2}, weight.options().dtype(at::kByte));
  at::Tensor scale = at::empty({out, groups, 2}, weight.options().dtype(at::kHalf));
  if (out == 0 || in == 0) return {data, scale};
  const float* w = weight.const_data_ptr<float>();
  auto* qp = data.mutable_data_ptr<uint8_t>();
  auto* sp = reinterpret_cast<uint16_t*>(scale.mutable_data_ptr<at::Half>());
  std::atomic<int64_t> first_bad{out};
  at::parallel_for(0, out, std::max<int64_t>(1, 65536 / in), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      if (!simd::run_on<int4::QuantizeGroups>(isa, w + r * in, in, qp + r * (in / 2), sp + r * 2 * groups)) {
        int64_t seen = first_bad.load();
        while (r < seen && !first_bad.compare_exchange_weak(seen, r)) {}
      }
    }
  });
  TORCH_CHECK(first_bad.load() == out, "quantize_int4_groups: expected finite weights whose groups' minimum and ",
              "range / 15 are within float16's 65504, got row ", first_bad.load(),
              " (a NaN or an infinity, or a group past that)");
  return {data, scale};
}

bool int4_weights(const at::Tensor& data, const at::Tensor& scale) {
  return int4::dense_cpu(data, 2) && data.scalar_type() == at::kByte && int4::dense_cpu(scale, 3) &&
         scale.scalar_type() == at::kHalf && scale.size(0) == data.size(0) && (2 * data.size(1)) % kInt4Group == 0 &&
         scale.size(1) == 2 * data.size(1) / kInt4Group && scale.size(2) == 2;
}

int64_t first_non_finite_int4_scale(const at::Tensor& scale_in) {
  TORCH_CHECK(scale_in.scalar_type() == at::kHalf && scale_in.dim() == 3 && scale_in.size(2) == 2,
              "first_non_finite_int4_scale: expected float16 [out, groups, 2], got ", scale_in.sizes(), " of ",
              scale_in.scalar_type());
  const at::Tensor scale = scale_in.contiguous();
  const auto* p = reinterpret_cast<const uint16_t*>(scale.const_data_ptr<at::Half>());
  const int64_t pairs = scale.numel() / 2;
  for (int64_t i = 0; i < pairs; ++i) {
    // Exponent bits all ones: an infinity or a NaN.
    if ((p[2 * i] & 0x7c00u) == 0x7c00u || (p[2 * i + 1] & 0x7c00u) == 0x7c00u) return i;
  }
  return -1;
}

namespace int4 {

void dequantize_rows(const uint8_t* q, const uint16_t* dm, int64_t in, int64_t begin, int64_t end, float* out) {
  const Isa isa = best_isa();
  const int64_t groups = in / kGroup;
  for (int64_t o = begin; o < end; ++o) {
    simd::run_on<Dequantize>(isa, q + o * (in / 2), dm + o * 2 * groups, groups, out + (o - begin) * in);
  }
}

namespace {

// Weight rows [begin, end) four at a time (fewer than four left: the first again); for
// each four and each block of up to kFourRowsX rows of x from r0, kernel(qs, dms, r0, nr,
// d) writes their products to d (d[4 r + k]: weight row k, x row r0 + r), and
// y[r0 + r, o + k] = d[4 r + k] + bias[o + k]. Which four, per `streams`:
// - adjacent (false): rows o .. o + 3, the rows after next prefetched while these are
//   summed;
// - four long streams (true, one row of x with AVX2): the rows split in four runs of m,
//   row j of each run summed together, no software prefetches, as the int8 and bfloat16
//   kernels read them on AVX2 (int8_tiles.cpp, quantized_linear.cpp). A 1B-shaped
//   model's int4 decoding (tools/make_scale_model.py), a 2-core AMD EPYC Zen 3 (AVX2,
//   no VNNI), 2 threads, 3 interleaved rounds, medians: 17.5 tokens/s (14.7-17.8)
//   against 11.0 (10.8-11.4) for adjacent rows with the prefetches (the same pair
//   kernel; one group at a time: 9.9); int8 13.0 in the same rounds. VNNI keeps the
//   adjacent rows (not measured on an AVX-512 CPU with streams).
template <class Kernel>
void four_rows_at_a_time(const uint8_t* q, const uint16_t* dm, int64_t in, int64_t begin, int64_t end, int64_t rows,
                         bool streams, const float* bias, float* y, int64_t ldy, const Kernel& kernel) {
  const int64_t groups = in / kGroup, row_bytes = in / 2;
  const int64_t runs = streams ? (end - begin) / 4 : 0;  // rows per stream
  const auto four = [&](const int64_t* row, int64_t n) {
    const uint8_t* qs[4];
    const uint16_t* dms[4];
    for (int64_t k = 0; k < 4; ++k) {
      qs[k] = q + row[k] * row_bytes;
      dms[k] = dm + row[k] * 2 * groups;
    }
    for (int64_t r0 = 0; r0 < rows; r0 += kFourRowsX) {
      const int64_t nr = std::min(kFourRowsX, rows - r0);
      float d[4 * kFourRowsX];
      kernel(static_cast<const uint8_t* const*>(qs), static_cast<const uint16_t* const*>(dms), r0, nr, d);
      for (int64_t r = 0; r < nr; ++r) {
        for (int64_t k = 0; k < n; ++k) {
          y[(r0 + r) * ldy + row[k]] = bias != nullptr ? d[4 * r + k] + bias[row[k]] : d[4 * r + k];
        }
      }
    }
  };
  for (int64_t j = 0; j < runs; ++j) {
    const int64_t row[4] = {begin + j, begin + runs + j, begin + 2 * runs + j, begin + 3 * runs + j};
    four(row, 4);
  }
  for (int64_t o = begin + 4 * runs; o < end; o += 4) {
    const int64_t n = std::min<int64_t>(4, end - o);
    const int64_t row[4] = {o, o + (n > 1 ? 1 : 0), o + (n > 2 ? 2 : 0), o + (n > 3 ? 3 : 0)};
    if (!streams && o + 12 <= end) {
      const char* ahead = reinterpret_cast<const char*>(q + (o + 8) * row_bytes);
      for (int64_t b = 0; b < 4 * row_bytes; b += 64) __builtin_prefetch(ahead + b);
      const char* ahead_dm = reinterpret_cast<const char*>(dm + (o + 8) * 2 * groups);
      for (int64_t b = 0; b < int64_t{16} * groups; b += 64) __builtin_prefetch(ahead_dm + b);
    }
    four(row, n);
  }
}

// Whether one row of x reads the weights as four long streams (four_rows_at_a_time).
bool long_streams(Isa isa, int64_t rows) { return rows == 1 && isa >= Isa::Avx2 && isa < Isa::Avx512Vnni; }

}  // namespace

void dot_rows(const uint8_t* q, const uint16_t* dm, int64_t in, int64_t begin, int64_t end, const float* xs,
              const float* sx, int64_t rows, const float* bias, float* y, int64_t ldy) {
  const Isa isa = best_isa();
  const int64_t groups = in / kGroup;
  four_rows_at_a_time(q, dm, in, begin, end, rows, long_streams(isa, rows), bias, y, ldy,
                      [&](const uint8_t* const* qs, const uint16_t* const* dms, int64_t r0, int64_t nr, float* d) {
                        for (int64_t r = r0; r < r0 + nr; ++r) {
                          simd::run_on<DotFour>(isa, qs, dms, xs + r * in, sx + r * groups, groups, d + 4 * (r - r0));
                        }
                      });
}

void dot_rows_products(Isa isa, const uint8_t* q, const uint16_t* dm, int64_t in, int64_t begin, int64_t end,
                       const int8_t* qx, const float* sp, int64_t rows, const float* bias, float* y, int64_t ldy) {
  const int64_t groups = in / kGroup;
  // The AVX2 and VNNI kernels' order of x's bytes (pair_inputs), once for this thread's
  // outputs.
  std::vector<int8_t> paired(isa >= Isa::Avx2 ? static_cast<size_t>(rows * in) : 0);
  for (int64_t r = 0; r < rows && !paired.empty(); ++r) pair_inputs(qx + r * in, in, paired.data() + r * in);
  four_rows_at_a_time(q, dm, in, begin, end, rows, long_streams(isa, rows), bias, y, ldy,
                      [&](const uint8_t* const* qs, const uint16_t* const* dms, int64_t r0, int64_t nr, float* d) {
#if defined(TORCHATTN_SIMD_X86)
                        if (isa >= Isa::Avx512Vnni) {
                          for (int64_t r = r0; r < r0 + nr; ++r) {
                            products_four_vnni(qs, dms, paired.data() + r * in, sp + 2 * r * groups, groups,
                                               d + 4 * (r - r0));
                          }
                          return;
                        }
                        if (isa >= Isa::Avx2) {
                          if (nr == 1) {
                            products_rows_avx2<true>(qs, dms, paired.data() + r0 * in, sp + 2 * r0 * groups, 1, in, d);
                          } else {
                            products_rows_avx2<false>(qs, dms, paired.data() + r0 * in, sp + 2 * r0 * groups, nr, in,
                                                      d);
                          }
                          return;
                        }
#endif
                        for (int64_t r = r0; r < r0 + nr; ++r) {
                          products_four_portable(qs, dms, qx + r * in, sp + 2 * r * groups, groups, d + 4 * (r - r0));
                        }
                      });
}

namespace {

// Rows [r0, r1) of quantize_inputs.
void quantize_input_rows(const float* xs, int64_t r0, int64_t r1, int64_t in, int64_t groups, int8_t* qx, float* sp) {
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* x = xs + r * in + g * kGroup;
      int8_t* q = qx + r * in + g * kGroup;
      bool finite = true;
      float most = 0.0f;
      for (int64_t i = 0; i < kGroup; ++i) {
        finite = finite && std::isfinite(x[i]);
        most = std::max(most, std::fabs(x[i]));
      }
      const float scale = finite ? most / 127.0f : std::numeric_limits<float>::quiet_NaN();
      int32_t sum = 0;
      for (int64_t i = 0; i < kGroup; ++i) {
        q[i] = finite && scale > 0.0f
                   ? static_cast<int8_t>(std::clamp(simd::Scalar::round(x[i] / scale), -127.0f, 127.0f))
                   : int8_t{0};
        sum += q[i];
      }
      sp[2 * (r * groups + g)] = scale;
      // The sum of the quantized x (s times the integers' sum), not of x: the offset m
      // then meets the same x as the steps d do, and the product is that of the
      // dequantized weights with the quantized x (llama.cpp's q8_1). With x's own sum
      // the rounding of x met d q (never negative) instead of d q + m. SmolLM2-135M's
      // Q4_1 file, the perplexity of 1270 tokens in windows of 128 with the prefill's
      // tiles: 44.21 against 45.15 with x's sum (float32 43.93; llama.cpp 44.19).
      sp[2 * (r * groups + g) + 1] = scale * static_cast<float>(sum);
    }
  }
}

}  // namespace

void quantize_inputs(const float* xs, int64_t rows, int64_t in, int8_t* qx, float* sp) {
  const int64_t groups = in / kGroup;
  // Rows over the intra-op threads where there are many (a prefill): each row's bits
  // are its own.
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(in, 1)),
                   [&](int64_t r0, int64_t r1) { quantize_input_rows(xs, r0, r1, in, groups, qx, sp); });
}

void group_sums(const float* xs, int64_t rows, int64_t in, float* sx) {
  const int64_t groups = in / kGroup;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* x = xs + r * in + g * kGroup;
      float s = 0.0f;
      for (int64_t i = 0; i < kGroup; ++i) s += x[i];
      sx[r * groups + g] = s;
    }
  }
}

}  // namespace int4

}  // namespace torchattn::kernels::cpu

TORCHATTN_SIMD_KERNELS_END

// The int8 products of int8_products.h with AVX2 (no VNNI): vpmaddubsw multiplies x's
// |qx| (unsigned bytes) by the weights given qx's sign (vpsignb), summing pairs into
// int16 (at most 2 * 127 * 127: never saturates), and vpmaddwd by ones sums those pairs
// into int32 lanes of four products each. The int32 sums are exact, and every float32
// step is int8_products.h's, in its order: the same bits as the portable loop and the
// VNNI kernels.
//
// Up to kFewRows rows (decoding) the weights are read in place: one row of x, four
// long streams of weight rows side by side (see one_row), four groups of 64 of a row
// summed across their registers together and scaled in a register; more rows of x, four
// weight rows at a time with software prefetches, as the VNNI kernels do. More rows (prefill) repack
// the weights a panel of 16 outputs at a time into 4-byte groups (one output a lane)
// and run tiles of 4 rows x 16 outputs over them.

#include "kernels/cpu/int8_rows.h"

#include "kernels/cpu/stall_aware.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(TORCHATTN_SIMD_X86)
#include <immintrin.h>

namespace torchattn::kernels::cpu::int8 {

// (A namespace of its own: a unity build compiles this file beside the other kernels.)
namespace avx2_kernels {
namespace {

constexpr int64_t kPanel = 16;    // outputs per repacked panel (two 8-lane registers)
constexpr int64_t kTileRows = 4;  // rows of x per pass over a panel
// One row of x, an output left over after the four streams (one_row): the weights this
// many bytes ahead prefetched. Measured when every output went one stream this way, on
// a Llama-3.2-1B-shaped model's int8 weights (1141 MB a token, the kernel alone) on a
// 2-core AMD EPYC Zen 3 (AVX2, no VNNI), 2 threads, medians of 3-4 interleaved rounds:
// none 22.4 GB/s, 512 ahead 23.6, 1024 24.0-25.1, 2048 22.8-25.7, 4096 23.0; 1 thread:
// none 12.8-15.0, 1024 16.6.
constexpr int64_t kAhead = 1024;
static_assert(kRowTile % kTileRows == 0, "QuantizedRows pads rows to whole tiles");

__attribute__((target("avx2"), always_inline)) inline __m256i load(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

// The int32 lanes of 32 products: w's bytes times x's (|qx| in mag, qx in sgn).
__attribute__((target("avx2"), always_inline)) inline __m256i dot32(__m256i w, __m256i mag, __m256i sgn, __m256i ones) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(mag, _mm256_sign_epi8(w, sgn)), ones);
}

// Four int32 registers -> their four sums (exact).
__attribute__((target("avx2"), always_inline)) inline __m128i sum_four(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i abcd = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
  return _mm_add_epi32(_mm256_castsi256_si128(abcd), _mm256_extracti128_si256(abcd, 1));
}

// The 64 weights of a group from w (whole), or its first `left` copied into `spare`
// and zeros after (a short last group: never a read past the weights).
inline const int8_t* group_weights(const int8_t* w, int64_t left, int8_t* spare) {
  if (left >= kGroup) return w;
  std::memset(spare, 0, kGroup);
  std::memcpy(spare, w, static_cast<size_t>(left));
  return spare;
}

// acc + t[0] * x[0] + ... + t[3] * x[3], one fused multiply-add at a time in that
// order (std::fma's rounding at each step): the groups' float32 steps in order.
__attribute__((target("avx2,fma"), always_inline)) inline __m128 fma_four(__m128 t, __m128 x, __m128 acc) {
  acc = _mm_fmadd_ss(t, x, acc);
  acc = _mm_fmadd_ss(_mm_movehdup_ps(t), _mm_movehdup_ps(x), acc);
  acc = _mm_fmadd_ss(_mm_movehl_ps(t, t), _mm_movehl_ps(x, x), acc);
  return _mm_fmadd_ss(_mm_shuffle_ps(t, t, 3), _mm_shuffle_ps(x, x, 3), acc);
}

// Output o of one row of x from acc, its sum over the whole fours of groups (one_row):
// the groups after them one at a time (a short last group among them), then the bias.
__attribute__((target("avx2,fma"))) void finish_row(const QuantizedRows& xr, const Int8Call& c, int64_t o,
                                                    int64_t first, float acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  const uint8_t* mag = xr.mag.data();
  const int8_t* sgn = xr.sgn.data();
  alignas(32) int8_t spare[kGroup];
  const int8_t* w = c.q + o * c.in;
  const float* s = c.scale + o * xr.groups;
  for (int64_t g = first; g < xr.groups; ++g) {
    const int64_t at = g * kGroup;
    const int8_t* wg = group_weights(w + at, c.in - at, spare);
    const __m256i v = _mm256_add_epi32(dot32(load(wg), load(mag + at), load(sgn + at), ones),
                                       dot32(load(wg + 32), load(mag + at + 32), load(sgn + at + 32), ones));
    const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    const __m128i h2 = _mm_hadd_epi32(h, h);
    const int32_t d = _mm_cvtsi128_si32(_mm_hadd_epi32(h2, h2));
    acc = std::fma(static_cast<float>(d) * s[g], xr.scale[g], acc);
  }
  c.y[o] = c.bias != nullptr ? acc + c.bias[o] : acc;
}

// One row of x against the weight rows of outputs o[0..R): each row read in place, four
// groups of 64 at a time summed across their registers together, their scales applied
// as a vector and summed in order in a register (no trip through memory); the R rows
// side by side, a quad of groups of each in turn, so R streams of weights are in flight.
// The groups past the last whole four (a short last group among them) one at a time.
template <int R>
__attribute__((target("avx2,fma"), always_inline)) inline void rows_of(const QuantizedRows& xr, const Int8Call& c,
                                                                       const int64_t* o) {
  const int64_t groups = xr.groups, in = c.in;
  const int64_t quads = in / (4 * kGroup);  // whole groups, four at a time
  const __m256i ones = _mm256_set1_epi16(1);
  const uint8_t* mag = xr.mag.data();
  const int8_t* sgn = xr.sgn.data();
  __m128 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm_setzero_ps();
  for (int64_t q4 = 0; q4 < quads; ++q4) {
    const int64_t at = q4 * 4 * kGroup;
    const __m128 xs = _mm_loadu_ps(xr.scale.data() + q4 * 4);
    for (int r = 0; r < R; ++r) {
      const int8_t* w = c.q + o[r] * in;
      if (R == 1) {
        for (int j = 0; j < 4; ++j) __builtin_prefetch(w + at + kAhead + 64 * j);
      }
      __m256i v[4];
      for (int j = 0; j < 4; ++j) {
        const int64_t k = at + j * kGroup;
        v[j] = _mm256_add_epi32(dot32(load(w + k), load(mag + k), load(sgn + k), ones),
                                dot32(load(w + k + 32), load(mag + k + 32), load(sgn + k + 32), ones));
      }
      const __m128 t = _mm_mul_ps(_mm_cvtepi32_ps(sum_four(v[0], v[1], v[2], v[3])),
                                  _mm_loadu_ps(c.scale + o[r] * groups + q4 * 4));
      acc[r] = fma_four(t, xs, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) finish_row(xr, c, o[r], quads * 4, _mm_cvtss_f32(acc[r]));
}

// One row of x (a decoding step), outputs [begin, end): four long streams of weight
// rows, the outputs split in four runs of m and output j of each run summed together
// (rows_of, without software prefetches); the (end - begin) % 4 outputs left one at a
// time (prefetched kAhead). Each output's bits are those of one stream. The same 1B
// model's weights, the same machine, 5 interleaved rounds: 23.7 GB/s (21.3-27.7)
// against 20.6 (19.1-22.0) for one prefetched stream at 2 threads; 13.3-15.9 against
// 12.0-12.5 at 1 thread. Four streams with the prefetches too: 13.3-16.6 (2 threads).
__attribute__((target("avx2,fma"))) void one_row(const QuantizedRows& xr, const Int8Call& c, int64_t begin,
                                                 int64_t end) {
  const int64_t m = (end - begin) / 4;
  for (int64_t j = 0; j < m; ++j) {
    const int64_t o[4] = {begin + j, begin + j + m, begin + j + 2 * m, begin + j + 3 * m};
    rows_of<4>(xr, c, o);
  }
  for (int64_t o = begin + 4 * m; o < end; ++o) rows_of<1>(xr, c, &o);
}

// Two to kFewRows rows of x, outputs [begin, end): four weight rows at a time, each
// group's weights loaded once for every row of x.
__attribute__((target("avx2,fma"))) void few_rows(const QuantizedRows& xr, int64_t rows, const Int8Call& c,
                                                  int64_t begin, int64_t end) {
  const int64_t groups = xr.groups, in = c.in, stride = xr.padded_in;
  const __m256i ones = _mm256_set1_epi16(1);
  alignas(16) float acc[kFewRows][4];
  alignas(32) int8_t spare[4][kGroup];
  for (int64_t o = begin; o < end; o += 4) {
    const int64_t n = std::min<int64_t>(4, end - o);
    const int8_t* w[4];
    const float* s[4];
    for (int64_t k = 0; k < 4; ++k) {
      const int64_t row = o + (k < n ? k : 0);
      w[k] = c.q + row * in;
      s[k] = c.scale + row * groups;
    }
    // The rows after next on their way from memory while these are summed.
    if (o + 12 <= end) {
      const char* ahead = reinterpret_cast<const char*>(c.q + (o + 8) * in);
      for (int64_t b = 0; b < 4 * in; b += 64) __builtin_prefetch(ahead + b);
    }
    for (int64_t m = 0; m < rows; ++m) _mm_store_ps(acc[m], _mm_setzero_ps());
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t at = g * kGroup;
      __m256i lo[4], hi[4];
      for (int k = 0; k < 4; ++k) {
        const int8_t* wg = group_weights(w[k] + at, in - at, spare[k]);
        lo[k] = load(wg);
        hi[k] = load(wg + 32);
      }
      const __m128 sw = _mm_set_ps(s[3][g], s[2][g], s[1][g], s[0][g]);
      for (int64_t m = 0; m < rows; ++m) {
        const uint8_t* mag = xr.mag.data() + m * stride + at;
        const int8_t* sgn = xr.sgn.data() + m * stride + at;
        const __m256i ml = load(mag), mh = load(mag + 32), sl = load(sgn), sh = load(sgn + 32);
        __m256i v[4];
        for (int k = 0; k < 4; ++k) {
          v[k] = _mm256_add_epi32(dot32(lo[k], ml, sl, ones), dot32(hi[k], mh, sh, ones));
        }
        const __m128 t = _mm_mul_ps(_mm_cvtepi32_ps(sum_four(v[0], v[1], v[2], v[3])), sw);
        _mm_store_ps(acc[m], _mm_fmadd_ps(t, _mm_set1_ps(xr.scale[m * groups + g]), _mm_load_ps(acc[m])));
      }
    }
    for (int64_t m = 0; m < rows; ++m) {
      for (int64_t k = 0; k < n; ++k) {
        c.y[m * c.ldy + o + k] = c.bias != nullptr ? acc[m][k] + c.bias[o + k] : acc[m][k];
      }
    }
  }
}

// A panel of kPanel outputs [o0, o0 + kPanel) in 4-byte groups:
// words[(k / 4) * kPanel + j] = q[o0 + j, k .. k + 4) (zeros past `out` and past `in`),
// and the scales [groups, kPanel] (zeros past `out`).
struct Panel {
  std::vector<int32_t> words;
  std::vector<float> scale;
};

void repack(const Int8Call& c, int64_t groups, int64_t o0, Panel& p) {
  const int64_t quads = groups * kGroup / 4, whole = c.in / 4;
  p.words.assign(static_cast<size_t>(quads * kPanel), 0);
  p.scale.assign(static_cast<size_t>(groups * kPanel), 0.0f);
  int32_t* words = p.words.data();
  for (int64_t j = 0; j < kPanel && o0 + j < c.out; ++j) {
    const int8_t* row = c.q + (o0 + j) * c.in;
    int64_t k4 = 0;
    for (; k4 < whole; ++k4) std::memcpy(words + k4 * kPanel + j, row + k4 * 4, 4);
    if (k4 * 4 < c.in) {
      int8_t four[4] = {0, 0, 0, 0};
      std::memcpy(four, row + k4 * 4, static_cast<size_t>(c.in - k4 * 4));
      std::memcpy(words + k4 * kPanel + j, four, 4);
    }
    for (int64_t g = 0; g < groups; ++g) p.scale[g * kPanel + j] = c.scale[(o0 + j) * groups + g];
  }
}

// Rows [m0, m0 + kTileRows) x the panel's outputs into acc ([kTileRows, kPanel] floats):
// each group's int32 sums in registers, then scaled into the float32 sums in acc.
__attribute__((target("avx2,fma"))) void panel_rows(const QuantizedRows& xr, const Panel& p, int64_t m0, float* acc) {
  const int64_t groups = xr.groups, stride = xr.padded_in;
  const __m256i ones = _mm256_set1_epi16(1);
  const uint8_t* mag[kTileRows];
  const int8_t* sgn[kTileRows];
  for (int64_t r = 0; r < kTileRows; ++r) {
    mag[r] = xr.mag.data() + (m0 + r) * stride;
    sgn[r] = xr.sgn.data() + (m0 + r) * stride;
    _mm256_storeu_ps(acc + r * kPanel, _mm256_setzero_ps());
    _mm256_storeu_ps(acc + r * kPanel + 8, _mm256_setzero_ps());
  }
  for (int64_t g = 0; g < groups; ++g) {
    __m256i d00 = _mm256_setzero_si256(), d01 = d00, d10 = d00, d11 = d00, d20 = d00, d21 = d00, d30 = d00, d31 = d00;
    const int32_t* wg = p.words.data() + g * kGroup / 4 * kPanel;
    const int64_t k0 = g * kGroup;
#define TORCHATTN_AVX2_ROW(r)                                             \
  {                                                                       \
    int32_t fm, fs;                                                       \
    std::memcpy(&fm, mag[r] + k, 4);                                      \
    std::memcpy(&fs, sgn[r] + k, 4);                                      \
    const __m256i mb = _mm256_set1_epi32(fm), sb = _mm256_set1_epi32(fs); \
    d##r##0 = _mm256_add_epi32(d##r##0, dot32(w0, mb, sb, ones));         \
    d##r##1 = _mm256_add_epi32(d##r##1, dot32(w1, mb, sb, ones));         \
  }
#pragma GCC unroll 4
    for (int64_t kq = 0; kq < kGroup / 4; ++kq) {
      const int64_t k = k0 + kq * 4;
      const __m256i w0 = load(wg + kq * kPanel), w1 = load(wg + kq * kPanel + 8);
      TORCHATTN_AVX2_ROW(0)
      TORCHATTN_AVX2_ROW(1)
      TORCHATTN_AVX2_ROW(2)
      TORCHATTN_AVX2_ROW(3)
    }
#undef TORCHATTN_AVX2_ROW
    const __m256i d[kTileRows][2] = {{d00, d01}, {d10, d11}, {d20, d21}, {d30, d31}};
    const __m256 s0 = _mm256_loadu_ps(p.scale.data() + g * kPanel);
    const __m256 s1 = _mm256_loadu_ps(p.scale.data() + g * kPanel + 8);
    for (int64_t r = 0; r < kTileRows; ++r) {
      const __m256 sx = _mm256_set1_ps(xr.scale[(m0 + r) * groups + g]);
      float* a = acc + r * kPanel;
      const __m256 t0 = _mm256_mul_ps(_mm256_cvtepi32_ps(d[r][0]), s0);
      const __m256 t1 = _mm256_mul_ps(_mm256_cvtepi32_ps(d[r][1]), s1);
      _mm256_storeu_ps(a, _mm256_fmadd_ps(t0, sx, _mm256_loadu_ps(a)));
      _mm256_storeu_ps(a + 8, _mm256_fmadd_ps(t1, sx, _mm256_loadu_ps(a + 8)));
    }
  }
}

void panels(const QuantizedRows& xr, int64_t rows, const Int8Call& c) {
  run_panels<kPanel, kTileRows, Panel>(
      c, rows, [&](int64_t o0, Panel& p) { repack(c, xr.groups, o0, p); },
      [&](const Panel& p, int64_t m0, float* acc) { panel_rows(xr, p, m0, acc); });
}

}  // namespace
}  // namespace avx2_kernels

__attribute__((target("avx2"))) void avx2_prepare(QuantizedRows& xr) {
  const int64_t n = xr.rows * xr.padded_in;  // a multiple of kGroup
  xr.mag.resize(static_cast<size_t>(n));
  xr.sgn.resize(static_cast<size_t>(n));
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t i = 0; i < n; i += 32) {
    const __m256i q = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr.bytes.data() + i)), flip);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(xr.sgn.data() + i), q);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(xr.mag.data() + i), _mm256_abs_epi8(q));
  }
}

void avx2_rows(const QuantizedRows& xr, int64_t rows, const Int8Call& c, int64_t begin, int64_t end) {
  if (rows == 1) {
    avx2_kernels::one_row(xr, c, begin, end);
  } else {
    avx2_kernels::few_rows(xr, rows, c, begin, end);
  }
}

void avx2_panels(const QuantizedRows& xr, int64_t rows, const Int8Call& c) { avx2_kernels::panels(xr, rows, c); }

}  // namespace torchattn::kernels::cpu::int8

#endif

#include "kernels/cpu/int8_rows.h"

#include "kernels/cpu/stall_aware.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(TORCHATTN_SIMD_X86)
#include <immintrin.h>

namespace torchattn::kernels::cpu::int8 {

// (A namespace of its own: a unity build compiles this file beside the other kernels.)
namespace vnni_kernels {
namespace {

constexpr int64_t kPanel = 32;  // outputs per repacked panel (two 16-lane registers)

// A panel of kPanel outputs [o0, o0 + kPanel) repacked for VNNI: 4-byte groups
// words[(k / 4) * kPanel + j] = q[o0 + j, k .. k + 4) (zeros past `out` and past `in`),
// with -128 * the sum of each group's weights (the unsigned products' excess, where
// each group's int32 sums start) and the scales, both [groups, kPanel] (zeros past `out`).
struct Panel {
  std::vector<int32_t> words;
  std::vector<int32_t> start;
  std::vector<float> scale;
};

__attribute__((target("avx512f,avx512bw,avx512vnni"))) void repack(const int8_t* q, const float* scale, int64_t in,
                                                                   int64_t out, int64_t groups, int64_t o0, Panel& p) {
  const int64_t quads = groups * kGroup / 4, whole = in / 4;
  p.words.resize(static_cast<size_t>(quads * kPanel));
  p.start.resize(static_cast<size_t>(groups * kPanel));
  p.scale.resize(static_cast<size_t>(groups * kPanel));
  int32_t* words = p.words.data();
  for (int64_t j = 0; j < kPanel; ++j) {
    if (o0 + j >= out) {
      for (int64_t k4 = 0; k4 < quads; ++k4) words[k4 * kPanel + j] = 0;
      for (int64_t g = 0; g < groups; ++g) p.scale[g * kPanel + j] = 0.0f;
      continue;
    }
    const int8_t* row = q + (o0 + j) * in;
    int64_t k4 = 0;
    for (; k4 < whole; ++k4) std::memcpy(words + k4 * kPanel + j, row + k4 * 4, 4);
    for (; k4 < quads; ++k4) {
      int8_t four[4] = {0, 0, 0, 0};
      for (int64_t k = k4 * 4; k < std::min(in, k4 * 4 + 4); ++k) four[k - k4 * 4] = row[k];
      std::memcpy(words + k4 * kPanel + j, four, 4);
    }
    for (int64_t g = 0; g < groups; ++g) p.scale[g * kPanel + j] = scale[(o0 + j) * groups + g];
  }
  // The sums by the instruction itself: 128 (bytes 0x80) times the weights.
  const __m512i ones = _mm512_set1_epi32(static_cast<int32_t>(0x80808080u));
  for (int64_t g = 0; g < groups; ++g) {
    __m512i c0 = _mm512_setzero_si512(), c1 = _mm512_setzero_si512();
    for (int64_t kq = 0; kq < kGroup / 4; ++kq) {
      const int32_t* w = words + (g * kGroup / 4 + kq) * kPanel;
      c0 = _mm512_dpbusd_epi32(c0, ones, _mm512_loadu_si512(w));
      c1 = _mm512_dpbusd_epi32(c1, ones, _mm512_loadu_si512(w + 16));
    }
    _mm512_storeu_si512(p.start.data() + g * kPanel, _mm512_sub_epi32(_mm512_setzero_si512(), c0));
    _mm512_storeu_si512(p.start.data() + g * kPanel + 16, _mm512_sub_epi32(_mm512_setzero_si512(), c1));
  }
}

// y[m0 .. m0 + kRowTile) x [o0, o0 + kPanel) for one panel into acc ([kRowTile,
// kPanel] floats): each group's int32 sums in registers (two registers of outputs x
// kRowTile rows), then scaled into the float32 sums in acc.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void panel_rows(const QuantizedRows& xr, const Panel& p,
                                                                       int64_t m0, float* acc) {
  const int64_t groups = xr.groups;
  const uint8_t* x[kRowTile];
  for (int64_t r = 0; r < kRowTile; ++r) {
    x[r] = xr.bytes.data() + (m0 + r) * xr.padded_in;
    _mm512_storeu_ps(acc + r * kPanel, _mm512_setzero_ps());
    _mm512_storeu_ps(acc + r * kPanel + 16, _mm512_setzero_ps());
  }
  const int32_t* w = p.words.data();
  for (int64_t g = 0; g < groups; ++g) {
    const __m512i c0 = _mm512_loadu_si512(p.start.data() + g * kPanel);
    const __m512i c1 = _mm512_loadu_si512(p.start.data() + g * kPanel + 16);
    // Sixteen named accumulators (GCC keeps an array of them in registers less well).
    __m512i d00 = c0, d01 = c1, d10 = c0, d11 = c1, d20 = c0, d21 = c1, d30 = c0, d31 = c1;
    __m512i d40 = c0, d41 = c1, d50 = c0, d51 = c1, d60 = c0, d61 = c1, d70 = c0, d71 = c1;
    const int32_t* wg = w + g * kGroup / 4 * kPanel;
    const int64_t k0 = g * kGroup;
#define TORCHATTN_INT8_ROW(r)                      \
  {                                                \
    int32_t four;                                  \
    std::memcpy(&four, x[r] + k, 4);               \
    const __m512i a = _mm512_set1_epi32(four);     \
    d##r##0 = _mm512_dpbusd_epi32(d##r##0, a, w0); \
    d##r##1 = _mm512_dpbusd_epi32(d##r##1, a, w1); \
  }
#pragma GCC unroll 4
    for (int64_t kq = 0; kq < kGroup / 4; ++kq) {
      const int64_t k = k0 + kq * 4;
      const __m512i w0 = _mm512_loadu_si512(wg + kq * kPanel);
      const __m512i w1 = _mm512_loadu_si512(wg + kq * kPanel + 16);
      TORCHATTN_INT8_ROW(0)
      TORCHATTN_INT8_ROW(1)
      TORCHATTN_INT8_ROW(2)
      TORCHATTN_INT8_ROW(3)
      TORCHATTN_INT8_ROW(4)
      TORCHATTN_INT8_ROW(5)
      TORCHATTN_INT8_ROW(6)
      TORCHATTN_INT8_ROW(7)
    }
#undef TORCHATTN_INT8_ROW
    const __m512i d[kRowTile][2] = {{d00, d01}, {d10, d11}, {d20, d21}, {d30, d31},
                                    {d40, d41}, {d50, d51}, {d60, d61}, {d70, d71}};
    const __m512 s0 = _mm512_loadu_ps(p.scale.data() + g * kPanel);
    const __m512 s1 = _mm512_loadu_ps(p.scale.data() + g * kPanel + 16);
    for (int64_t r = 0; r < kRowTile; ++r) {
      const __m512 sx = _mm512_set1_ps(xr.scale[(m0 + r) * groups + g]);
      float* a = acc + r * kPanel;
      const __m512 t0 = _mm512_mul_ps(_mm512_cvtepi32_ps(d[r][0]), s0);
      const __m512 t1 = _mm512_mul_ps(_mm512_cvtepi32_ps(d[r][1]), s1);
      _mm512_storeu_ps(a, _mm512_fmadd_ps(t0, sx, _mm512_loadu_ps(a)));
      _mm512_storeu_ps(a + 16, _mm512_fmadd_ps(t1, sx, _mm512_loadu_ps(a + 16)));
    }
  }
}

// Four int32 registers -> their four sums (exact), in the low 128 bits.
__attribute__((target("avx512f,avx512bw,avx512vnni,fma"), always_inline)) inline __m128i sum_four(__m512i a, __m512i b,
                                                                                                  __m512i c,
                                                                                                  __m512i d) {
  const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
  const __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
  __m512i u = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
  u = _mm512_add_epi32(u, _mm512_shuffle_i32x4(u, u, _MM_SHUFFLE(1, 0, 3, 2)));
  u = _mm512_add_epi32(u, _mm512_shuffle_i32x4(u, u, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_castsi512_si128(u);
}

// A group of 64 weights, or the first `left` of them (zeros after) for a short last group.
// Masked byte loads only where needed: on AMD Zen 5 a masked vmovdqu8 streams at a
// quarter of a plain load's rate (one row of x over 128 MB of int8 weights, one core:
// 5.7 GB/s with masked loads of every group against 20.4 GB/s).
__attribute__((target("avx512f,avx512bw"), always_inline)) inline __m512i load_group(const int8_t* w, int64_t left) {
  if (left >= kGroup) return _mm512_loadu_si512(w);
  return _mm512_maskz_loadu_epi8((__mmask64{1} << left) - 1, w);
}

// One row of x (a decoding step): each output's groups four at a time, their int32 sums
// added across the registers together, then scaled in order. One weight row at a time
// is one stream that the hardware prefetchers follow (123.6 against 101.6 tokens/s for
// vnni_few_rows with software prefetches, SmolLM2-135M int8 on a 2-core AMD EPYC; a
// software prefetch 8 KiB down the one stream gained nothing there on an AMD EPYC Zen 5).
// Four long streams, as AVX2's one_row reads (row j of four runs of outputs together,
// sharing x's loads), ran at less than half the rate on the Zen 5: a 1B model's int8
// decoding at 16.4 against 34.4 tokens/s (2 threads), 9.6 against 22.2 (1 thread).
__attribute__((target("avx512f,avx512bw,avx512vnni,fma"))) void vnni_one_row(const QuantizedRows& xr, const int8_t* q,
                                                                             const float* scale, int64_t in,
                                                                             const float* bias, int64_t begin,
                                                                             int64_t end, float* y) {
  const int64_t groups = xr.groups;
  const __m512i excess = _mm512_set1_epi32(static_cast<int32_t>(0x80808080u));
  const uint8_t* xb = xr.bytes.data();
  for (int64_t o = begin; o < end; ++o) {
    const int8_t* w = q + o * in;
    const float* s = scale + o * groups;
    float acc = 0.0f;
    for (int64_t g0 = 0; g0 < groups; g0 += 4) {
      __m512i v[4];
      for (int j = 0; j < 4; ++j) {
        const int64_t g = g0 + j;
        if (g >= groups) {
          v[j] = _mm512_setzero_si512();
          continue;
        }
        const int64_t left = in - g * kGroup;
        const __m512i wv = load_group(w + g * kGroup, left);
        const __m512i start = _mm512_sub_epi32(_mm512_setzero_si512(),
                                               _mm512_dpbusd_epi32(_mm512_setzero_si512(), excess, wv));
        v[j] = _mm512_dpbusd_epi32(start, _mm512_loadu_si512(xb + g * kGroup), wv);
      }
      alignas(16) int32_t d[4];
      _mm_store_si128(reinterpret_cast<__m128i*>(d), sum_four(v[0], v[1], v[2], v[3]));
      for (int64_t j = 0; j < std::min<int64_t>(4, groups - g0); ++j) {
        acc = std::fma(static_cast<float>(d[j]) * s[g0 + j], xr.scale[g0 + j], acc);
      }
    }
    y[o] = bias != nullptr ? acc + bias[o] : acc;
  }
}

// Two to kFewRows rows of x (decoding a batch): the weights read in place, four output
// rows at a time, with software prefetches of the rows after next: each group's 64 weights of a row in one register (a
// short last group masked), its products with every row of x summed in int32 across the register, then scaled into the
// float32 sums as the panel kernel does. Outputs [begin, end).
__attribute__((target("avx512f,avx512bw,avx512vnni,fma"))) void vnni_few_rows(const QuantizedRows& xr, int64_t rows,
                                                                              const int8_t* q, const float* scale,
                                                                              int64_t in, int64_t ldy,
                                                                              const float* bias, int64_t begin,
                                                                              int64_t end, float* y) {
  const int64_t groups = xr.groups;
  const __m512i excess = _mm512_set1_epi32(static_cast<int32_t>(0x80808080u));
  alignas(16) float acc[kFewRows][4];
  for (int64_t o = begin; o < end; o += 4) {
    const int64_t n = std::min<int64_t>(4, end - o);
    const int8_t* w[4];
    const float* s[4];
    for (int64_t k = 0; k < 4; ++k) {
      const int64_t row = o + (k < n ? k : 0);
      w[k] = q + row * in;
      s[k] = scale + row * groups;
    }
    // The rows after next on their way from memory while these are summed.
    if (o + 12 <= end) {
      const char* ahead = reinterpret_cast<const char*>(q + (o + 8) * in);
      for (int64_t b = 0; b < 4 * in; b += 64) __builtin_prefetch(ahead + b);
    }
    for (int64_t m = 0; m < rows; ++m) _mm_store_ps(acc[m], _mm_setzero_ps());
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t g0 = g * kGroup, left = in - g0;
      __m512i wv[4], start[4];
      for (int k = 0; k < 4; ++k) {
        wv[k] = load_group(w[k] + g0, left);
        // x's bytes are qx + 128: each sum starts at -128 times the weights.
        start[k] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), excess, wv[k]));
      }
      const __m128 sw = _mm_set_ps(s[3][g], s[2][g], s[1][g], s[0][g]);
      for (int64_t m = 0; m < rows; ++m) {
        const __m512i a = _mm512_loadu_si512(xr.bytes.data() + m * xr.padded_in + g0);
        const __m128i d = sum_four(_mm512_dpbusd_epi32(start[0], a, wv[0]), _mm512_dpbusd_epi32(start[1], a, wv[1]),
                                   _mm512_dpbusd_epi32(start[2], a, wv[2]), _mm512_dpbusd_epi32(start[3], a, wv[3]));
        const __m128 t = _mm_mul_ps(_mm_cvtepi32_ps(d), sw);
        _mm_store_ps(acc[m], _mm_fmadd_ps(t, _mm_set1_ps(xr.scale[m * groups + g]), _mm_load_ps(acc[m])));
      }
    }
    for (int64_t m = 0; m < rows; ++m) {
      for (int64_t k = 0; k < n; ++k) y[m * ldy + o + k] = bias != nullptr ? acc[m][k] + bias[o + k] : acc[m][k];
    }
  }
}

void vnni(const QuantizedRows& xr, int64_t rows, const Int8Call& c) {
  run_panels<kPanel, kRowTile, Panel>(
      c, rows, [&](int64_t o0, Panel& p) { repack(c.q, c.scale, c.in, c.out, xr.groups, o0, p); },
      [&](const Panel& p, int64_t m0, float* acc) { panel_rows(xr, p, m0, acc); });
}
}  // namespace
}  // namespace vnni_kernels

void vnni_rows(const QuantizedRows& xr, int64_t rows, const Int8Call& c, int64_t begin, int64_t end) {
  if (rows == 1) {
    vnni_kernels::vnni_one_row(xr, c.q, c.scale, c.in, c.bias, begin, end, c.y);
  } else {
    vnni_kernels::vnni_few_rows(xr, rows, c.q, c.scale, c.in, c.ldy, c.bias, begin, end, c.y);
  }
}

void vnni_panels(const QuantizedRows& xr, int64_t rows, const Int8Call& c) { vnni_kernels::vnni(xr, rows, c); }

}  // namespace torchattn::kernels::cpu::int8

#endif

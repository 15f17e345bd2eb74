// The int8 products of int4 weights for more rows of x than the few-rows kernels take
// (a prefill): int4_rows.h's products_tiles. Each thread repacks its panels of kPanel
// outputs once a call, their 4-bit values widened to bytes in 4-byte words (one output a
// lane, inputs 4k .. 4k + 3 in word k) with each group's d and m as floats, then passes
// blocks of up to kBlockRows rows of x (their bytes kept in the L2 cache) over every
// panel: per group of 32 inputs and row of x, AVX2's vpmaddubsw multiplies the unsigned
// values by x's signed bytes (4 bytes broadcast), eight steps summed in int16 (at most
// 8 * 2 * 15 * 127 = 30480: exact), one vpmaddwd to int32, then d s and m sum into
// float32 sums, as the few-rows kernels scale them.
//
// A 1B-shaped model's prefill of 512 tokens in int4 (tools/make_scale_model.py), a
// 2-core AMD EPYC Zen 3 (AVX2), 2 threads: 7.1-7.6 s against 12.4 s for the widened
// tiles' float32 GEMM before it (int8's prefill 9.2-9.3 s on the same machine).

#include "kernels/cpu/int4_rows.h"

#include <torchattn/detail/kernels/cpu/simd.h>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

TORCHATTN_SIMD_KERNELS_BEGIN

namespace torchattn::kernels::cpu::int4 {

namespace {

constexpr int64_t kTileGroup = kInt4Group;  // inputs per (d, m) pair
constexpr int64_t kPanel = 16;              // outputs per panel: two registers of eight lanes
constexpr int64_t kBlockRows = 64;          // rows of x per pass over a panel, at most
constexpr int64_t kBlockBytes = 256 << 10;  // x's bytes per block of rows (half an L2)
constexpr int64_t kPanelsBytes = 2 << 20;   // a thread's repacked panels at once, at most

// A panel of kPanel outputs [o0, o0 + kPanel) (zeros past `out`):
// words[(g * 8 + k) * kPanel + j] = the values of output o0 + j, inputs 32 g + 4 k .. + 4,
// one a byte; d and m [groups, kPanel] as floats. Views into a thread's buffer.
struct TilePanel {
  uint32_t* words;
  float* d;
  float* m;
};

void repack_panel(const uint8_t* q, const uint16_t* dm, int64_t out, int64_t in, int64_t o0, const TilePanel& p) {
  const int64_t groups = in / kTileGroup;
  std::fill(p.words, p.words + groups * 8 * kPanel, 0u);
  std::fill(p.d, p.d + groups * kPanel, 0.0f);
  std::fill(p.m, p.m + groups * kPanel, 0.0f);
  for (int64_t j = 0; j < kPanel && o0 + j < out; ++j) {
    const uint8_t* row = q + (o0 + j) * (in / 2);
    const uint16_t* pairs = dm + (o0 + j) * 2 * groups;
    for (int64_t g = 0; g < groups; ++g) {
      uint8_t values[kTileGroup];
      const uint8_t* b = row + g * (kTileGroup / 2);
      for (int64_t i = 0; i < kTileGroup / 2; ++i) {
        values[i] = b[i] & 15;
        values[i + kTileGroup / 2] = b[i] >> 4;
      }
      for (int64_t k = 0; k < 8; ++k) std::memcpy(p.words + (g * 8 + k) * kPanel + j, values + 4 * k, 4);
      p.d[g * kPanel + j] = simd::Scalar::widen_halves(pairs + 2 * g);
      p.m[g * kPanel + j] = simd::Scalar::widen_halves(pairs + 2 * g + 1);
    }
  }
}

TORCHATTN_SIMD_TARGETS_BEGIN
#if defined(TORCHATTN_SIMD_X86)
// Rows [0, rows) of x (qx, their (s, sum) pairs sp; rows <= kBlockRows) over one panel:
// y[r, o0 + j] for the panel's outputs below `out`. A group's 512 bytes of the panel
// stay in the L1 cache while each row of x passes over them, its eight steps summed in
// two int16 registers (five registers live: no spills).
__attribute__((target("avx2,fma,f16c"))) void tile_avx2(const TilePanel& p, const int8_t* qx, const float* sp,
                                                        int64_t rows, int64_t in, int64_t o0, int64_t out,
                                                        const float* bias, float* y, int64_t ldy) {
  const int64_t groups = in / kTileGroup;
  const __m256i ones = _mm256_set1_epi16(1);
  alignas(32) float acc[kBlockRows][kPanel];
  for (int64_t r = 0; r < rows; ++r) {
    _mm256_store_ps(acc[r], _mm256_setzero_ps());
    _mm256_store_ps(acc[r] + 8, _mm256_setzero_ps());
  }
  for (int64_t g = 0; g < groups; ++g) {
    const uint32_t* w = p.words + g * 8 * kPanel;
    const __m256 d0 = _mm256_loadu_ps(p.d + g * kPanel), d1 = _mm256_loadu_ps(p.d + g * kPanel + 8);
    const __m256 m0 = _mm256_loadu_ps(p.m + g * kPanel), m1 = _mm256_loadu_ps(p.m + g * kPanel + 8);
    for (int64_t r = 0; r < rows; ++r) {
      const int8_t* xg = qx + r * in + g * kTileGroup;
      __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int64_t k = 0; k < 8; ++k) {
        int32_t four;
        std::memcpy(&four, xg + 4 * k, 4);
        const __m256i xb = _mm256_set1_epi32(four);
        const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + k * kPanel));
        const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + k * kPanel + 8));
        s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(w0, xb));
        s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(w1, xb));
        // The two sums kept as chains in registers: GCC would otherwise reassociate the
        // integer adds into a tree of sixteen products, spilled to the stack.
        asm("" : "+x"(s0), "+x"(s1));
      }
      const __m256 s = _mm256_set1_ps(sp[2 * (r * groups + g)]), sum = _mm256_set1_ps(sp[2 * (r * groups + g) + 1]);
      const __m256 t0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(s0, ones)), d0);
      const __m256 t1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(s1, ones)), d1);
      _mm256_store_ps(acc[r], _mm256_fmadd_ps(m0, sum, _mm256_fmadd_ps(t0, s, _mm256_load_ps(acc[r]))));
      _mm256_store_ps(acc[r] + 8, _mm256_fmadd_ps(m1, sum, _mm256_fmadd_ps(t1, s, _mm256_load_ps(acc[r] + 8))));
    }
  }
  const int64_t n = std::min(kPanel, out - o0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n; ++j) y[r * ldy + o0 + j] = bias != nullptr ? acc[r][j] + bias[o0 + j] : acc[r][j];
  }
}
#endif
TORCHATTN_SIMD_TARGETS_END

}  // namespace

bool products_tiles_apply(Isa isa) {
#if defined(TORCHATTN_SIMD_X86)
  // Where they were measured faster than the widened float32 GEMM: AVX2 (the figures
  // above). AVX-512 CPUs keep the float32 GEMM (oneDNN's AVX-512) until the tiles are
  // measured there or have VNNI's own (TORCHATTN_ISA=avx2 runs these there).
  return isa == Isa::Avx2;
#else
  (void)isa;
  return false;
#endif
}

void products_tiles(Isa isa, const uint8_t* q, const uint16_t* dm, int64_t out, int64_t in, const int8_t* qx,
                    const float* sp, int64_t rows, const float* bias, float* y, int64_t ldy) {
  TORCH_CHECK(isa >= Isa::Avx2, "int4 products_tiles: needs AVX2");
#if defined(TORCHATTN_SIMD_X86)
  const int64_t groups = in / kTileGroup, panels = (out + kPanel - 1) / kPanel;
  // Rows of x per block: a block's bytes (rows x in) stay in the L2 cache while the
  // thread's panels pass over them. The panels are repacked (their values as bytes:
  // twice the weights' size) kPanelsBytes at a time into the thread's buffer, and every
  // block of rows passes over those before the next are repacked: x is read once per
  // such run of panels, and the buffer stays bounded (repacking a thread's every panel
  // at once held 21 MB a thread for a 1B-shaped model's 2048 x 8192 down projection,
  // a quarter of a 4-bit generation's heap).
  const int64_t block = std::clamp<int64_t>(kBlockBytes / in, 1, kBlockRows);
  const int64_t panel_words = groups * 8 * kPanel, panel_floats = groups * kPanel;
  const int64_t panel_bytes = panel_words * 4 + 2 * panel_floats * 4;
  const int64_t at_once = std::max<int64_t>(1, kPanelsBytes / panel_bytes);
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    const int64_t most = std::min(at_once, end - begin);
    std::unique_ptr<uint32_t[]> words(new uint32_t[static_cast<size_t>(most * panel_words)]);
    std::unique_ptr<float[]> floats(new float[static_cast<size_t>(2 * most * panel_floats)]);
    const auto view = [&](int64_t i) {
      return TilePanel{words.get() + i * panel_words, floats.get() + 2 * i * panel_floats,
                       floats.get() + (2 * i + 1) * panel_floats};
    };
    for (int64_t p0 = begin; p0 < end; p0 += most) {
      const int64_t n = std::min(most, end - p0);
      for (int64_t i = 0; i < n; ++i) repack_panel(q, dm, out, in, (p0 + i) * kPanel, view(i));
      for (int64_t b0 = 0; b0 < rows; b0 += block) {
        const int64_t b1 = std::min(rows, b0 + block);
        for (int64_t i = 0; i < n; ++i) {
          tile_avx2(view(i), qx + b0 * in, sp + 2 * b0 * groups, b1 - b0, in, (p0 + i) * kPanel, out, bias,
                    y + b0 * ldy, ldy);
        }
      }
    }
  });
#else
  (void)q, (void)dm, (void)out, (void)in, (void)qx, (void)sp, (void)rows, (void)bias, (void)y, (void)ldy;
#endif
}

}  // namespace torchattn::kernels::cpu::int4

TORCHATTN_SIMD_KERNELS_END

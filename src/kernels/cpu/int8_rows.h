#pragma once

// The rows of x as the int8 product kernels read them (int8_products.h): quantized per
// group of kInt8Group inputs, and the kernels over them (int8_tiles.cpp: the portable
// loop, AVX2's and VNNI's, written once over simd.h's types).

#include <torchattn/detail/kernels/cpu/cpu_features.h>
#include "kernels/cpu/quantized_linear.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace torchattn::kernels::cpu::int8 {

inline constexpr int64_t kGroup = kInt8Group;              // inputs per scale, of x and of the weights
inline constexpr int64_t kRowTile = 8;                     // rows are padded to a multiple of this
inline constexpr int64_t kFewRows = kQuantizedMatvecRows;  // at most these rows read the weights in place

// x's rows quantized, [rows_padded, groups * kGroup] (padding: qx 0, scale 0): as
// unsigned bytes qx + 128 (VNNI's vpdpbusd, the portable loop), and for AVX2's
// vpmaddubsw as |qx| (mag) and qx (sgn) where the kernel is Avx2.
struct QuantizedRows {
  std::vector<uint8_t> bytes;
  std::vector<uint8_t> mag;
  std::vector<int8_t> sgn;
  std::vector<float> scale;
  int64_t rows = 0, padded_in = 0, groups = 0;
};

// One weight matrix of a call: q int8 [out, in], scale float32 [out, groups], bias [out]
// or null; its outputs go to y[m * ldy + o] (y: the part's first column of row 0).
struct Int8Call {
  const int8_t* q;
  const float* scale;
  int64_t in, out;
  const float* bias;
  float* y;
  int64_t ldy;
};

// Every output of part c for `rows` rows of x, a panel of kPanel outputs at a time over
// the intra-op threads (the *_panels kernels' driver): each thread repacks a panel
// (repack(o0, panel)), runs the row tiles of kTile over it (tile(panel, m0, acc): acc
// [kTile, kPanel] floats) and writes each tile's rows with the bias.
template <int64_t kPanel, int64_t kTile, class Panel, class Repack, class Tile>
void run_panels(const Int8Call& c, int64_t rows, const Repack& repack, const Tile& tile) {
  const int64_t count = (c.out + kPanel - 1) / kPanel;
  at::parallel_for(0, count, 1, [&](int64_t b, int64_t e) {
    Panel p;
    alignas(64) float acc[kTile * kPanel];
    for (int64_t pi = b; pi < e; ++pi) {
      const int64_t o0 = pi * kPanel, n = std::min(kPanel, c.out - o0);
      repack(o0, p);
      for (int64_t m0 = 0; m0 < rows; m0 += kTile) {
        tile(p, m0, acc);
        for (int64_t r = 0; r < std::min(kTile, rows - m0); ++r) {
          float* dst = c.y + (m0 + r) * c.ldy + o0;
          const float* t = acc + r * kPanel;
          for (int64_t j = 0; j < n; ++j) dst[j] = c.bias != nullptr ? t[j] + c.bias[o0 + j] : t[j];
        }
      }
    }
  });
}

// The kernel of `isa` (int8_products.h: the one each Isa runs), the numbers of
// int8_products.h:
// - prepare: x's operands the kernel reads besides bytes (AVX2's mag and sgn);
// - kernel_rows: at most kFewRows rows of x, outputs [begin, end) of the part, on the
//   calling thread (the caller splits every part's outputs over the threads at once);
// - kernel_panels: more rows, every output of the part, over the intra-op threads.
void prepare(Isa isa, QuantizedRows& xr);
void kernel_rows(Isa isa, const QuantizedRows& xr, int64_t rows, const Int8Call& c, int64_t begin, int64_t end);
void kernel_panels(Isa isa, const QuantizedRows& xr, int64_t rows, const Int8Call& c);

}  // namespace torchattn::kernels::cpu::int8

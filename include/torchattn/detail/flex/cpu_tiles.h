#pragma once

// The register tiles that flex_attention's float32 kernels (cpu_forward_tiles.h,
// cpu_backward_tiles.h) are made of, written once over the vector types of the SIMD
// layer (detail/kernels/cpu/simd.h), each a product of a few rows against a block of keys:
//   score_tile:   R rows x n keys of a . b over keys packed transposed (scores, and the
//                 backward's dout . v; score_rows: by the fewest rows that hold a
//                 tile's); transpose_keys packs one block of them;
//   weigh_values: acc rows = acc * factor + sum over keys of weight x a key's row (the
//                 forward's numerators x values, the backward's dq += ds k), over
//                 every column by weigh_rows;
//   add_outer:    per key, row += sum over query rows of weight x a query's row (the
//                 backward's dk += ds^T q and dv += p^T dout).
// No helper returns a vector: a function of no target passing one by value changes
// GCC's ABI, which it warns of in the translation unit that instantiates it.

#include <torchattn/detail/kernels/cpu/simd.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstdint>

TORCHATTN_SIMD_KERNELS_BEGIN

namespace torchattn::flex {

/// Vectors of keys in a score tile: its keys are kScoreTileVectors * W.
inline constexpr int64_t kScoreTileVectors = 2;

/// Keys of the widest score tile (AVX-512's), the pad of packed keys past their last.
inline constexpr int64_t kWidestScoreTile = kScoreTileVectors * 16;

/// x [B, H, T, D] packed transposed for score_tile: [B, H, D, T_pad], zeros past T, T_pad
/// a whole number of the widest score tiles and one more (a block's last tile may read
/// up to a tile past its end).
inline at::Tensor pack_transposed(const at::Tensor& x) {
  const int64_t T = x.size(2);
  const int64_t pad = (T + kWidestScoreTile - 1) / kWidestScoreTile * kWidestScoreTile + kWidestScoreTile;
  at::Tensor packed = at::empty({x.size(0), x.size(1), x.size(3), pad}, x.options());
  packed.narrow(3, 0, T).copy_(x.transpose(2, 3));
  packed.narrow(3, T, pad - T).zero_();
  return packed;
}

/// dst[e * pitch + j] = src[j * stride + e] for keys j < n and columns e < depth: a block
/// of key rows transposed for score_tile (the keys of a call that packs none, where it
/// reads them), in squares of 8 (S::transpose8) and one float at a time at the edges.
template <class S>
void transpose_keys(const float* src, int64_t stride, int64_t n, int64_t depth, float* dst, int64_t pitch) {
  const int64_t n8 = n / 8 * 8, d8 = depth / 8 * 8;
  for (int64_t j = 0; j < n8; j += 8) {
    for (int64_t e = 0; e < d8; e += 8) S::transpose8(src + j * stride + e, stride, dst + e * pitch + j, pitch);
    for (int64_t jj = j; jj < j + 8; ++jj) {
      for (int64_t e = d8; e < depth; ++e) dst[e * pitch + jj] = src[jj * stride + e];
    }
  }
  for (int64_t j = n8; j < n; ++j) {
    for (int64_t e = 0; e < depth; ++e) dst[e * pitch + j] = src[j * stride + e];
  }
}

/// Asks for the cache lines of n rows of `cols` floats, rows `stride` floats apart, to be
/// loaded (a hint: no fault, no result).
inline void prefetch_rows(const float* x, int64_t stride, int64_t n, int64_t cols) {
  constexpr int64_t kLine = 64 / sizeof(float);
  for (int64_t j = 0; j < n; ++j, x += stride) {
    for (int64_t e = 0; e < cols; e += kLine) __builtin_prefetch(x + e);
  }
}

/// out[r * stride + j] = scale * sum_e row[r][e] packed[e * pitch + j] for r < R and j in
/// whole tiles of keys covering [0, n) (the tiles' keys past n too: they read the pad).
/// rows: R pointers to `depth` floats (repeat one for rows a tile lacks).
/// Where the vector registers hold them (a tile of few rows: a decoding step's), the sums
/// run in two chains over the depth, its even and odd columns, added at the end: each
/// chain half as long, about half the rounding (a chain of 64 products rounds as much as
/// the decode kernels' dot products did not).
template <class S, int64_t R>
void score_tile(const float* const* row, const float* packed, int64_t pitch, int64_t depth, int64_t n, float* out,
                int64_t stride, const typename S::V& scale) {
  using V = typename S::V;
  constexpr int W = S::W;
  constexpr int64_t NK = kScoreTileVectors, KT = NK * W;
  constexpr int64_t kRegisters = W == 16 ? 32 : 16;  // AVX-512's zmm, else AVX2's ymm
  constexpr int64_t C = 2 * R * NK + NK + 1 <= kRegisters ? 2 : 1;
  for (int64_t jt = 0; jt < n; jt += KT) {
    V sum[C][R][NK];
    for (auto& c : sum) {
      for (auto& r : c) {
        for (auto& x : r) x = S::zero();
      }
    }
    const float* kc = packed + jt;
    int64_t e = 0;
    for (; e + C <= depth; e += C) {
      for (int64_t c = 0; c < C; ++c, kc += pitch) {
        V kv[NK];
        for (int64_t m = 0; m < NK; ++m) kv[m] = S::load(kc + m * W);
        for (int64_t r = 0; r < R; ++r) {
          const V qv = S::set1(row[r][e + c]);
          for (int64_t m = 0; m < NK; ++m) sum[c][r][m] = S::fma(qv, kv[m], sum[c][r][m]);
        }
      }
    }
    if (e < depth) {  // an odd depth's last column
      V kv[NK];
      for (int64_t m = 0; m < NK; ++m) kv[m] = S::load(kc + m * W);
      for (int64_t r = 0; r < R; ++r) {
        const V qv = S::set1(row[r][e]);
        for (int64_t m = 0; m < NK; ++m) sum[0][r][m] = S::fma(qv, kv[m], sum[0][r][m]);
      }
    }
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t m = 0; m < NK; ++m) {
        V total = sum[0][r][m];
        for (int64_t c = 1; c < C; ++c) total = S::add(total, sum[c][r][m]);
        S::store(out + r * stride + jt + m * W, S::mul(total, scale));
      }
    }
  }
}

/// score_tile for the first `rows` (<= R) of the R rows, by a tile of the fewest rows
/// (R, R / 2, ...) that holds them: a decoding call's tile of 1-4 rows computes no copies.
template <class S, int64_t R>
void score_rows(int64_t rows, const float* const* row, const float* packed, int64_t pitch, int64_t depth, int64_t n,
                float* out, int64_t stride, const typename S::V& scale) {
  if constexpr (R > 1) {
    if (rows <= R / 2) {
      score_rows<S, R / 2>(rows, row, packed, pitch, depth, n, out, stride, scale);
      return;
    }
  }
  score_tile<S, R>(row, packed, pitch, depth, n, out, stride, scale);
}

/// acc rows arow[0, stored) at columns [c0, c0 + cols) (cols <= NO vectors; kWhole:
/// exactly NO) become acc * factor + sum_j p[j] v[j] over n keys from vc (rows
/// v_t apart); rows past `stored` repeat the last, computed and not stored.
template <class S, int64_t RO, int64_t NO, bool kWhole>
static void weigh_values(const float* const* prow, float* const* arow, const typename S::V* factor, int64_t stored,
                         const float* vc, int64_t v_t, int64_t n, int64_t c0, int64_t cols) {
  using V = typename S::V;
  constexpr int W = S::W;
  const int64_t nv = kWhole ? NO : (cols + W - 1) / W;
  const int last = kWhole ? W : static_cast<int>(cols - (nv - 1) * W);  // lanes of the last vector
  // (No helper returns a vector: a function of no target passing one by value
  // changes GCC's ABI, which it warns of in the caller's translation unit.)
  V sum[RO][NO];
  for (int64_t r = 0; r < RO; ++r) {
    for (int64_t m = 0; m < NO; ++m) {
      const float* p = arow[r] + c0 + m * W;
      sum[r][m] = S::mul(kWhole || m + 1 < nv ? S::load(p) : m < nv ? S::load(p, last) : S::zero(), factor[r]);
    }
  }
  for (int64_t j = 0; j < n; ++j, vc += v_t) {
    V vv[NO];
    for (int64_t m = 0; m < NO; ++m) {
      vv[m] = kWhole || m + 1 < nv ? S::load(vc + m * W) : m < nv ? S::load(vc + m * W, last) : S::zero();
    }
    for (int64_t r = 0; r < RO; ++r) {
      const V pv = S::set1(prow[r][j]);
      for (int64_t m = 0; m < NO; ++m) sum[r][m] = S::fma(pv, vv[m], sum[r][m]);
    }
  }
  // Loops of constant bounds, so that every index of sum is a constant and the compiler
  // keeps it in registers (an index bounded by `stored` kept GCC 12 writing the
  // accumulators to the stack at every key: 1.16x the time of a causal forward).
  for (int64_t r = 0; r < RO; ++r) {
    for (int64_t m = 0; m < NO; ++m) {
      if (r >= stored || m >= nv) continue;
      if (kWhole || m + 1 < nv) {
        S::store(arow[r] + c0 + m * W, sum[r][m]);
      } else {
        S::store(arow[r] + c0 + m * W, sum[r][m], last);
      }
    }
  }
}

/// acc rows r < rows (row r at acc + r * acc_t) become acc * factor[r] (factor null: 1)
/// + sum_{j < n} w[r * w_t + j] x[j * x_t + c] for the columns c < cols: weigh_values
/// over RO rows x NO vectors of columns at a time.
template <class S, int64_t RO, int64_t NO>
void weigh_rows(const float* w, int64_t w_t, float* acc, int64_t acc_t, const float* factor, int64_t rows,
                const float* x, int64_t x_t, int64_t n, int64_t cols) {
  using V = typename S::V;
  constexpr int W = S::W;
  for (int64_t r0 = 0; r0 < rows; r0 += RO) {
    const int64_t stored = std::min(RO, rows - r0);
    const float* wrow[RO];
    float* arow[RO];
    V f[RO];
    for (int64_t r = 0; r < RO; ++r) {
      const int64_t rr = r0 + std::min(r, stored - 1);
      wrow[r] = w + rr * w_t;
      arow[r] = acc + rr * acc_t;
      f[r] = S::set1(factor ? factor[rr] : 1.0f);
    }
    for (int64_t c0 = 0; c0 < cols; c0 += NO * W) {
      const int64_t width = std::min<int64_t>(NO * W, cols - c0);
      if (width == NO * W) {
        weigh_values<S, RO, NO, true>(wrow, arow, f, stored, x + c0, x_t, n, c0, width);
      } else {
        weigh_values<S, RO, NO, false>(wrow, arow, f, stored, x + c0, x_t, n, c0, width);
      }
    }
  }
}

/// Per key j < n: key[j * key_t + c] += sum_{r < rows} w[r * stride + j] x[r * x_t + c]
/// for the columns c < cols, JK keys x NO vectors of columns in registers at a time.
template <class S, int64_t JK, int64_t NO>
void add_outer(const float* w, int64_t stride, const float* x, int64_t x_t, int64_t rows, float* key, int64_t key_t,
               int64_t n, int64_t cols) {
  using V = typename S::V;
  constexpr int W = S::W;
  for (int64_t c0 = 0; c0 < cols; c0 += NO * W) {
    const int64_t width = std::min<int64_t>(NO * W, cols - c0);
    const int64_t nv = (width + W - 1) / W;
    const int last = static_cast<int>(width - (nv - 1) * W);
    const bool whole = width == NO * W;
    for (int64_t j0 = 0; j0 < n; j0 += JK) {
      const int64_t keys = std::min(JK, n - j0);
      V sum[JK][NO];
      for (int64_t u = 0; u < JK; ++u) {
        const float* p = key + (j0 + std::min(u, keys - 1)) * key_t + c0;
        for (int64_t m = 0; m < NO; ++m) {
          sum[u][m] = whole || m + 1 < nv ? S::load(p + m * W) : m < nv ? S::load(p + m * W, last) : S::zero();
        }
      }
      const float* xr = x + c0;
      const float* wr = w + j0;
      for (int64_t r = 0; r < rows; ++r, xr += x_t, wr += stride) {
        V xv[NO];
        for (int64_t m = 0; m < NO; ++m) {
          xv[m] = whole || m + 1 < nv ? S::load(xr + m * W) : m < nv ? S::load(xr + m * W, last) : S::zero();
        }
        for (int64_t u = 0; u < JK; ++u) {
          const V wv = S::set1(wr[std::min(u, keys - 1)]);
          for (int64_t m = 0; m < NO; ++m) sum[u][m] = S::fma(wv, xv[m], sum[u][m]);
        }
      }
      for (int64_t u = 0; u < JK; ++u) {  // constant bounds: sum stays in registers (weigh_values)
        float* p = key + (j0 + u) * key_t + c0;
        for (int64_t m = 0; m < NO; ++m) {
          if (u >= keys || m >= nv) continue;
          if (whole || m + 1 < nv) {
            S::store(p + m * W, sum[u][m]);
          } else {
            S::store(p + m * W, sum[u][m], last);
          }
        }
      }
    }
  }
}

}  // namespace torchattn::flex

TORCHATTN_SIMD_KERNELS_END

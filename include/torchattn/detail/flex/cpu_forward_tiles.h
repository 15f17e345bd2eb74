#pragma once

// flex_attention's float32 forward on the CPU (flex_attention.h), written once over the
// vector types of the SIMD layer (detail/kernels/cpu/simd.h) and entered through run_on at the
// widest instruction set this CPU runs (AVX-512, AVX2 or plain floats), all inside the
// caller's translation unit: score_mod and mask_mod are inlined into the kernel of each
// instruction set, which the library's own kernels cannot do for a callable they never
// saw.
//
// A task is a tile of R query rows (AVX-512: 8, else 4) of one batch and head, within
// one block of queries of the block mask. For each block of keys the mask keeps (the
// full ones, then the partial ones), in order:
//   1. the scores of the tile, R rows x the block's keys, scaled (registers: R rows x
//      2 vectors of keys, over keys packed transposed);
//   2. score_mod per kept score (skipped for IdentityScore; W keys at a time for a mod
//      that runs on Lanes, lanes.h), mask_mod per key of a partial block (-inf where it
//      hides);
//   3. the online softmax of each row (RowSoftmax): numerators, and the factor for
//      what the row had accumulated;
//   4. the row's accumulated values, rescaled, plus numerators x values (registers:
//      RO rows x 4 vectors of value columns).
// Empty blocks are never read. The tasks of a head run in zigzag order (first, last,
// second, ...), so that a causal mask's split of them gives each thread as many keys.

#include <torchattn/flex/block_mask.h>
#include <torchattn/detail/flex/cpu_tiles.h>
#include <torchattn/flex/inputs.h>
#include <torchattn/flex/lanes.h>
#include <torchattn/detail/kernels/cpu/cpu_features.h>
#include <torchattn/detail/kernels/cpu/row_softmax.h>
#include <torchattn/detail/kernels/cpu/simd.h>

#include <torchattn/detail/kernels/cpu/parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

TORCHATTN_SIMD_KERNELS_BEGIN

namespace torchattn::flex {

/// One float32 call's operands: q and v rows (unit last stride), the keys packed
/// transposed, [B, Hkv, D, Tk_pad] with zeros past Tk, and the outputs.
struct TileOperands {
  const float* q;
  int64_t q_b, q_h, q_t;
  const float* kt;
  int64_t tk_pad;
  const float* v;
  int64_t v_b, v_h, v_t;
  float* out;  // [B, H, Tq, Dv], contiguous
  float* lse;  // [B, H, Tq]
};

template <class ScoreMod, class MaskMod>
struct ForwardTiles {
  static constexpr kernels::cpu::Isa kWidest = kernels::cpu::Isa::Avx512;

  /// Query rows of a tile for the vector type S (a block of queries holds whole tiles
  /// but for its last).
  template <class S>
  static constexpr int64_t rows() {
    return S::W == 16 ? 8 : 4;
  }


  /// Query rows of a tile for `isa`'s vector type (the task count's).
  struct TileRows {
    static constexpr kernels::cpu::Isa kWidest = kernels::cpu::Isa::Avx512;
    template <class S>
    static int64_t run() {
      return rows<S>();
    }
  };

  /// Tasks [begin, end) of B * H * q_blocks * tiles_per_block (see the file's comment).
  template <class S>
  static void run(const TileOperands& a, const Shapes& s, const ScoreMod& score_mod, const BlockMask<MaskMod>& mask,
                  int64_t begin, int64_t end) {
    using V = typename S::V;
    using Softmax = kernels::cpu::RowSoftmax<S>;
    constexpr int W = S::W;
    constexpr int64_t R = rows<S>(), KT = kScoreTileVectors * W, RO = W == 16 ? 4 : 2, NO = 4;
    constexpr bool kModsScores = !std::is_same_v<ScoreMod, IdentityScore>;
    const int64_t bs = mask.shape.block_size, nq = mask.shape.q_blocks(), tiles = (bs + R - 1) / R;
    const int64_t per_head = nq * tiles, group = s.H / s.Hkv, Dv = s.Dv;
    const int64_t stride = (bs + KT - 1) / KT * KT;  // a row of scores
    std::vector<float> scores(static_cast<size_t>(R * stride));
    std::vector<float> acc(static_cast<size_t>(R * Dv));
    const V vscale = S::set1(static_cast<float>(s.scale));
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bh = task / per_head, p = task % per_head;
      const int64_t zig = p % 2 == 0 ? p / 2 : per_head - 1 - p / 2;
      const int64_t qb = zig / tiles, t0 = qb * bs + zig % tiles * R;
      const int64_t rows = std::min({R, s.Tq - t0, (qb + 1) * bs - t0});
      if (rows <= 0) continue;  // past the last block's queries
      const int64_t b = bh / s.H, h = bh % s.H, hk = h / group;
      const float* qh = a.q + b * a.q_b + h * a.q_h;
      const float* kt = a.kt + (b * s.Hkv + hk) * s.D * a.tk_pad;
      const float* vh = a.v + b * a.v_b + hk * a.v_h;
      // Rows past the tile's last compute a copy of it, never stored.
      const float* qrow[R];
      for (int64_t r = 0; r < R; ++r) qrow[r] = qh + (t0 + std::min(r, rows - 1)) * a.q_t;
      Softmax softmax[R];
      float rescale[R];
      std::fill(acc.begin(), acc.end(), 0.0f);
      const auto blocks = mask.key_blocks(b, h, qb);
      for (int kind = 0; kind < 2; ++kind) {  // 0: full blocks, 1: partial ones
        for (int32_t c = 0; c < blocks.count[kind]; ++c) {
          const int64_t j0 = static_cast<int64_t>(blocks.index[kind][c]) * bs, n = std::min(bs, s.Tk - j0);
          // 1. Scaled scores, whole tiles of keys (past n: read from the pad).
          score_tile<S, R>(qrow, kt + j0, a.tk_pad, s.D, n, scores.data(), stride, vscale);
          // 2. The mods, per score.
          if (kind == 1 || kModsScores) {
            for (int64_t r = 0; r < rows; ++r) {
              float* sr = scores.data() + r * stride;
              const int64_t i = t0 + r;
              if constexpr (kModsScores && runs_in_lanes<ScoreMod>) {  // W keys at a time (lanes.h)
                for (int64_t j = 0; j < n; j += W) {                   // lanes past n: the pad's, never read
                  Lanes<S> in;
                  S::store(in.x, S::load(sr + j));
                  const Lanes<S> out = score_mod(in, b, h, i, LaneIndex<S>{j0 + j});
                  S::store(sr + j, S::load(out.x));
                }
                if (kind == 1) {
                  for (int64_t j = 0; j < n; ++j) {
                    if (!mask.visible(b, h, i, j0 + j)) sr[j] = kernels::cpu::simd::kNegInf;
                  }
                }
                continue;
              }
              for (int64_t j = 0; j < n; ++j) {
                if (kind == 1 && !mask.visible(b, h, i, j0 + j)) {
                  sr[j] = kernels::cpu::simd::kNegInf;
                } else if constexpr (kModsScores) {
                  sr[j] = static_cast<float>(score_mod(sr[j], b, h, i, j0 + j));
                }
              }
            }
          }
          // 3. Numerators, and each row's factor for what it holds.
          for (int64_t r = 0; r < rows; ++r) rescale[r] = softmax[r].add(scores.data() + r * stride, n);
          // 4. acc = acc * rescale + numerators x values, RO rows x NO vectors at a time.
          weigh_rows<S, RO, NO>(scores.data(), stride, acc.data(), Dv, rescale, rows, vh + j0 * a.v_t, a.v_t, n, Dv);
        }
      }
      // The rows' outputs: acc / sum; the log-sum-exp max + log(sum) (-inf for a row
      // that saw no key, whose acc stayed zeros; NaN after a NaN or +inf score).
      for (int64_t r = 0; r < rows; ++r) {
        const float inverse = softmax[r].inverse();
        float* o = a.out + (bh * s.Tq + t0 + r) * Dv;
        const float* ar = acc.data() + r * Dv;
        for (int64_t e = 0; e < Dv; ++e) o[e] = ar[e] * inverse;
        const float sum = softmax[r].sum;
        a.lse[bh * s.Tq + t0 + r] = std::isnan(sum) ? sum
                                    : sum == 0.0f   ? -std::numeric_limits<float>::infinity()
                                                    : softmax[r].max + std::log(sum);
      }
    }
  }
};

/// out [B, H, Tq, Dv] and lse [B, H, Tq] of a float32 call (checked inputs, sizes s).
template <class ScoreMod, class MaskMod>
void forward_tiles(const at::Tensor& q_in, const at::Tensor& k, const at::Tensor& v_in, const Shapes& s,
                   const ScoreMod& score_mod, const BlockMask<MaskMod>& mask, at::Tensor& out, at::Tensor& lse) {
  using Kernel = ForwardTiles<ScoreMod, MaskMod>;
  const at::Tensor q = q_in.stride(3) == 1 ? q_in : q_in.contiguous();
  const at::Tensor v = v_in.stride(3) == 1 ? v_in : v_in.contiguous();
  const at::Tensor kt = pack_transposed(k);
  const int64_t tk_pad = kt.size(3);
  const TileOperands a{q.const_data_ptr<float>(),
                       q.stride(0),
                       q.stride(1),
                       q.stride(2),
                       kt.const_data_ptr<float>(),
                       tk_pad,
                       v.const_data_ptr<float>(),
                       v.stride(0),
                       v.stride(1),
                       v.stride(2),
                       out.mutable_data_ptr<float>(),
                       lse.mutable_data_ptr<float>()};
  const kernels::cpu::Isa isa = kernels::cpu::best_isa();
  const int64_t R = kernels::cpu::simd::run_on<typename Kernel::TileRows>(isa);
  const int64_t tasks = s.B * s.H * mask.shape.q_blocks() * ((mask.shape.block_size + R - 1) / R);
  kernels::cpu::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    kernels::cpu::simd::run_on<Kernel>(isa, a, s, score_mod, mask, begin, end);
  });
}

}  // namespace torchattn::flex

TORCHATTN_SIMD_KERNELS_END

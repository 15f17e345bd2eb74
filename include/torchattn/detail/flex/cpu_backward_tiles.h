#pragma once

// flex_attention's float32 backward on the CPU (flex_attention.h), on the register tiles
// of cpu_tiles.h, entered through run_on at the widest instruction set this CPU runs
// (as cpu_forward_tiles.h). A task is one batch and key head: it owns that head's dk
// and dv and the dq of the query heads that read it. For each of those heads, each
// group of up to 32 query rows within a block of queries, and each block of keys the
// mask keeps:
//   per tile of R rows (AVX-512: 8, else 4):
//     s = scale q . k and dp = dout . v (score tiles over k and v packed transposed);
//     z = score_mod(s) on a Dual for dz/ds (skipped for IdentityScore), -inf where a
//     partial block's mask_mod hides; p = exp(z - lse), ds = p (dp - delta) dz/ds scale
//     with delta = dout . out - dlse of the row (dlse: the log-sum-exp's gradient);
//     dq += ds k (weigh_values);
//   then for the group: dk += ds^T q and dv += p^T dout (add_outer), each key's rows
//   of dk and dv read and written once per group.
// A row that saw no key (lse -inf) gets p = 0: no gradient.

#include <torchattn/flex/block_mask.h>
#include <torchattn/detail/flex/cpu_tiles.h>
#include <torchattn/flex/dual.h>
#include <torchattn/flex/inputs.h>
#include <torchattn/detail/kernels/cpu/cpu_features.h>
#include <torchattn/detail/kernels/cpu/simd.h>

#include <torchattn/detail/kernels/cpu/parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

TORCHATTN_SIMD_KERNELS_BEGIN

namespace torchattn::flex {

/// One float32 backward's operands, every tensor contiguous.
struct BackwardOperands {
  const float* q;     // [B, H, Tq, D]
  const float* k;     // [B, Hkv, Tk, D]
  const float* kt;    // k packed transposed, [B, Hkv, D, tk_pad]
  const float* vt;    // v packed transposed, [B, Hkv, Dv, tk_pad]
  const float* out;   // [B, H, Tq, Dv]
  const float* lse;   // [B, H, Tq]
  const float* dout;  // [B, H, Tq, Dv]
  const float* dlse;  // [B, H, Tq]
  int64_t tk_pad;
  float* dq;  // [B, H, Tq, D], zeroed
  float* dk;  // [B, Hkv, Tk, D], zeroed
  float* dv;  // [B, Hkv, Tk, Dv], zeroed
};

template <class ScoreMod, class MaskMod>
struct BackwardTiles {
  static constexpr kernels::cpu::Isa kWidest = kernels::cpu::Isa::Avx512;
  /// Query rows whose p and ds a block of keys keeps for dk and dv (at most).
  static constexpr int64_t kGroupRows = 32;

  /// Tasks [begin, end) of B * Hkv.
  template <class S>
  static void run(const BackwardOperands& a, const Shapes& s, const ScoreMod& score_mod, const BlockMask<MaskMod>& mask,
                  int64_t begin, int64_t end) {
    using V = typename S::V;
    constexpr int W = S::W;
    constexpr int64_t R = S::W == 16 ? 8 : 4, KT = kScoreTileVectors * W, RO = W == 16 ? 4 : 2, NO = 4;
    constexpr bool kModsScores = !std::is_same_v<ScoreMod, IdentityScore>;
    constexpr float kFloor = -87.0f;  // below: p is 0 (RowSoftmax's floor)
    const int64_t bs = mask.shape.block_size, nq = mask.shape.q_blocks(), group = s.H / s.Hkv;
    const int64_t D = s.D, Dv = s.Dv;
    const int64_t stride = (bs + KT - 1) / KT * KT;
    // p and ds of the group's rows (+ R: the last tile's rows past the group's end).
    std::vector<float> p(static_cast<size_t>((kGroupRows + R) * stride));
    std::vector<float> ds(static_cast<size_t>((kGroupRows + R) * stride));
    std::vector<float> dz(kModsScores ? static_cast<size_t>(R * stride) : 0);
    std::vector<float> delta(static_cast<size_t>(kGroupRows + R)), lse(static_cast<size_t>(kGroupRows + R));
    const V vscale = S::set1(static_cast<float>(s.scale)), one = S::set1(1.0f);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / s.Hkv, hk = task % s.Hkv;
      const float* kh = a.k + (b * s.Hkv + hk) * s.Tk * D;
      const float* kt = a.kt + (b * s.Hkv + hk) * D * a.tk_pad;
      const float* vt = a.vt + (b * s.Hkv + hk) * Dv * a.tk_pad;
      float* dkh = a.dk + (b * s.Hkv + hk) * s.Tk * D;
      float* dvh = a.dv + (b * s.Hkv + hk) * s.Tk * Dv;
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        const int64_t bh = b * s.H + h;
        for (int64_t qb = 0; qb < nq; ++qb) {
          const auto blocks = mask.key_blocks(b, h, qb);
          const int64_t q_end = std::min(s.Tq, (qb + 1) * bs);
          for (int64_t g0 = qb * bs; g0 < q_end; g0 += kGroupRows) {
            const int64_t grows = std::min(kGroupRows, q_end - g0);
            const float* qg = a.q + (bh * s.Tq + g0) * D;
            const float* gg = a.dout + (bh * s.Tq + g0) * Dv;
            float* dqg = a.dq + (bh * s.Tq + g0) * D;
            for (int64_t r = 0; r < grows; ++r) {
              const float* o = a.out + (bh * s.Tq + g0 + r) * Dv;
              float d = -a.dlse[bh * s.Tq + g0 + r];
              for (int64_t e = 0; e < Dv; ++e) d += gg[r * Dv + e] * o[e];
              delta[static_cast<size_t>(r)] = d;
              const float l = a.lse[bh * s.Tq + g0 + r];
              // A row that saw no key: z - lse is -inf, p 0.
              lse[static_cast<size_t>(r)] = l == -std::numeric_limits<float>::infinity()
                                                ? std::numeric_limits<float>::infinity()
                                                : l;
            }
            for (int kind = 0; kind < 2; ++kind) {  // 0: full blocks, 1: partial ones
              for (int32_t c = 0; c < blocks.count[kind]; ++c) {
                const int64_t j0 = static_cast<int64_t>(blocks.index[kind][c]) * bs, n = std::min(bs, s.Tk - j0);
                for (int64_t t0 = 0; t0 < grows; t0 += R) {
                  const int64_t rows = std::min(R, grows - t0);
                  const float* qrow[R];
                  const float* grow[R];
                  for (int64_t r = 0; r < R; ++r) {
                    qrow[r] = qg + (t0 + std::min(r, rows - 1)) * D;
                    grow[r] = gg + (t0 + std::min(r, rows - 1)) * Dv;
                  }
                  float* pt = p.data() + t0 * stride;
                  float* dst = ds.data() + t0 * stride;
                  score_tile<S, R>(qrow, kt + j0, a.tk_pad, D, n, pt, stride, vscale);  // s
                  score_tile<S, R>(grow, vt + j0, a.tk_pad, Dv, n, dst, stride, one);   // dp
                  if (kind == 1 || kModsScores) {
                    for (int64_t r = 0; r < rows; ++r) {
                      float* sr = pt + r * stride;
                      float* zr = kModsScores ? dz.data() + r * stride : nullptr;
                      const int64_t i = g0 + t0 + r;
                      for (int64_t j = 0; j < n; ++j) {
                        if (kind == 1 && !mask.visible(b, h, i, j0 + j)) {
                          sr[j] = kernels::cpu::simd::kNegInf;
                          if constexpr (kModsScores) zr[j] = 0.0f;
                        } else if constexpr (kModsScores) {
                          const Dual<float> z = score_mod(Dual<float>(sr[j], 1.0f), b, h, i, j0 + j);
                          sr[j] = z.v;
                          zr[j] = z.d;
                        }
                      }
                    }
                  }
                  // p = exp(z - lse), ds = p (dp - delta) dz/ds scale, whole vectors
                  // over [0, n) (lanes past n: whatever, never read).
                  for (int64_t r = 0; r < rows; ++r) {
                    float* pr = pt + r * stride;
                    float* dr = dst + r * stride;
                    const V l = S::set1(lse[static_cast<size_t>(t0 + r)]);
                    const V dl = S::set1(delta[static_cast<size_t>(t0 + r)]);
                    for (int64_t j = 0; j < n; j += W) {
                      const V x = S::sub(S::load(pr + j), l);
                      const V pv = S::below(x, kFloor, S::zero(), S::exp_neg(x));
                      V g = S::mul(S::mul(pv, S::sub(S::load(dr + j), dl)), vscale);
                      if constexpr (kModsScores) g = S::mul(g, S::load(dz.data() + r * stride + j));
                      S::store(pr + j, pv);
                      S::store(dr + j, g);
                    }
                  }
                  // dq += ds k, RO rows x NO vectors of columns at a time.
                  weigh_rows<S, RO, NO>(dst, stride, dqg + t0 * D, D, nullptr, rows, kh + j0 * D, D, n, D);
                }
                // dk += ds^T q, dv += p^T dout over the group's rows.
                add_outer<S, 4, W == 16 ? 4 : 2>(ds.data(), stride, qg, D, grows, dkh + j0 * D, D, n, D);
                add_outer<S, 4, W == 16 ? 4 : 2>(p.data(), stride, gg, Dv, grows, dvh + j0 * Dv, Dv, n, Dv);
              }
            }
          }
        }
      }
    }
  }
};

/// dq, dk, dv (contiguous, zeroed) of a float32 call from contiguous q, k, v, out, lse,
/// dout and dlse (sizes s).
template <class ScoreMod, class MaskMod>
void backward_tiles(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                    const at::Tensor& lse, const at::Tensor& dout, const at::Tensor& dlse, const Shapes& s,
                    const ScoreMod& score_mod, const BlockMask<MaskMod>& mask, at::Tensor& dq, at::Tensor& dk,
                    at::Tensor& dv) {
  using Kernel = BackwardTiles<ScoreMod, MaskMod>;
  const at::Tensor kt = pack_transposed(k), vt = pack_transposed(v);
  const BackwardOperands a{q.const_data_ptr<float>(),    k.const_data_ptr<float>(),    kt.const_data_ptr<float>(),
                           vt.const_data_ptr<float>(),   out.const_data_ptr<float>(),  lse.const_data_ptr<float>(),
                           dout.const_data_ptr<float>(), dlse.const_data_ptr<float>(), kt.size(3),
                           dq.mutable_data_ptr<float>(), dk.mutable_data_ptr<float>(), dv.mutable_data_ptr<float>()};
  const kernels::cpu::Isa isa = kernels::cpu::best_isa();
  kernels::cpu::parallel_for(0, s.B * s.Hkv, 1, [&](int64_t begin, int64_t end) {
    kernels::cpu::simd::run_on<Kernel>(isa, a, s, score_mod, mask, begin, end);
  });
}

}  // namespace torchattn::flex

TORCHATTN_SIMD_KERNELS_END

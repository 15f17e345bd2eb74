#pragma once

// flex_attention's backward on the CPU (flex_attention.h): the gradients of q, k and v
// from the output's, recomputing each kept score from q and k and its softmax weight
// from the forward's log-sum-exp. score_mod runs on a Dual (dual.h) for its derivative
// with respect to the score. float32 runs the tiled SIMD kernel (cpu_backward_tiles.h);
// float64, the precision of references, runs backward_rows below, one key at a time.
// One task per batch and key head (kernels::cpu::parallel_for), which owns that head's dk and dv
// and the dq of the query heads that read it:
//
//   p = exp(z - lse),  z = score_mod(s),  s = scale q . k
//   dv += p dout;  dp = dout . v;  dz = p (dp - delta);  ds = dz dz/ds
//   delta = dout . out - dlse  (d lse / d z = p: the log-sum-exp's gradient dlse joins)
//   dq += scale ds k;  dk += scale ds q

#include <torchattn/flex/block_mask.h>
#include <torchattn/detail/flex/cpu_backward_tiles.h>
#include <torchattn/flex/inputs.h>
#include <torchattn/flex/dual.h>

#include <torchattn/detail/kernels/cpu/parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace torchattn::flex {

/// The gradients for element type T: dq, dk, dv (contiguous, zeroed) from q, k, v, the
/// forward's out and lse, dout and dlse (contiguous, as the forward's).
template <class T, class ScoreMod, class MaskMod>
void backward_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                   const at::Tensor& lse, const at::Tensor& dout, const at::Tensor& dlse, const Shapes& s,
                   const ScoreMod& score_mod, const BlockMask<MaskMod>& mask, T* dq, T* dk, T* dv) {
  const T* qp = q.const_data_ptr<T>();
  const T* kp = k.const_data_ptr<T>();
  const T* vp = v.const_data_ptr<T>();
  const T* op = out.const_data_ptr<T>();
  const T* lp = lse.const_data_ptr<T>();
  const T* gp = dout.const_data_ptr<T>();
  const T* dlp = dlse.const_data_ptr<T>();
  const int64_t bs = mask.shape.block_size, nq = mask.shape.q_blocks();
  const int64_t group = s.H / s.Hkv, D = s.D, Dv = s.Dv;
  const T scale = static_cast<T>(s.scale);
  kernels::cpu::parallel_for(0, s.B * s.Hkv, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / s.Hkv, hk = task % s.Hkv;
      const T* kh = kp + (b * s.Hkv + hk) * s.Tk * D;
      const T* vh = vp + (b * s.Hkv + hk) * s.Tk * Dv;
      T* dkh = dk + (b * s.Hkv + hk) * s.Tk * D;
      T* dvh = dv + (b * s.Hkv + hk) * s.Tk * Dv;
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        const int64_t bh = b * s.H + h;
        for (int64_t qb = 0; qb < nq; ++qb) {
          const auto blocks = mask.key_blocks(b, h, qb);
          for (int64_t i = qb * bs; i < std::min(s.Tq, (qb + 1) * bs); ++i) {
            const T l = lp[bh * s.Tq + i];
            if (l == -std::numeric_limits<T>::infinity()) continue;  // saw no key: no gradient
            const T* qi = qp + (bh * s.Tq + i) * D;
            const T* gi = gp + (bh * s.Tq + i) * Dv;
            const T* oi = op + (bh * s.Tq + i) * Dv;
            T* dqi = dq + (bh * s.Tq + i) * D;
            T delta = -dlp[bh * s.Tq + i];
            for (int64_t e = 0; e < Dv; ++e) delta += gi[e] * oi[e];
            for (int kind = 0; kind < 2; ++kind) {
              for (int32_t c = 0; c < blocks.count[kind]; ++c) {
                const int64_t j0 = static_cast<int64_t>(blocks.index[kind][c]) * bs, j1 = std::min(s.Tk, j0 + bs);
                for (int64_t j = j0; j < j1; ++j) {
                  if (kind == 1 && !mask.visible(b, h, i, j)) continue;
                  const T* kj = kh + j * D;
                  const T* vj = vh + j * Dv;
                  T raw = 0;
                  for (int64_t e = 0; e < D; ++e) raw += qi[e] * kj[e];
                  const Dual<T> z = score_mod(Dual<T>(raw * scale, T(1)), b, h, i, j);
                  const T p = std::exp(z.v - l);
                  T dp = 0;
                  for (int64_t e = 0; e < Dv; ++e) dp += gi[e] * vj[e];
                  const T ds = p * (dp - delta) * z.d * scale;
                  T* dvj = dvh + j * Dv;
                  for (int64_t e = 0; e < Dv; ++e) dvj[e] += p * gi[e];
                  T* dkj = dkh + j * D;
                  for (int64_t e = 0; e < D; ++e) {
                    dqi[e] += ds * kj[e];
                    dkj[e] += ds * qi[e];
                  }
                }
              }
            }
          }
        }
      }
    }
  });
}

/// dq, dk, dv of flex_attention from dout and dlse, the output's and the log-sum-exp's
/// gradients (sizes s; q, k, v, out, lse as the forward's).
template <class ScoreMod, class MaskMod>
std::array<at::Tensor, 3> cpu_backward(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                       const at::Tensor& out, const at::Tensor& lse, const at::Tensor& dout_in,
                                       const at::Tensor& dlse_in, const Shapes& s, const ScoreMod& score_mod,
                                       const BlockMask<MaskMod>& mask) {
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const at::Tensor dout = dout_in.to(q.scalar_type()).contiguous(), o = out.contiguous(), l = lse.contiguous();
  const at::Tensor dlse = dlse_in.to(q.scalar_type()).contiguous();
  at::Tensor dq = at::zeros_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
  if (q.scalar_type() == at::kDouble) {
    backward_rows<double>(q, k, v, o, l, dout, dlse, s, score_mod, mask, dq.mutable_data_ptr<double>(),
                          dk.mutable_data_ptr<double>(), dv.mutable_data_ptr<double>());
  } else {
    backward_tiles(q, k, v, o, l, dout, dlse, s, score_mod, mask, dq, dk, dv);
  }
  return {dq, dk, dv};
}

}  // namespace torchattn::flex

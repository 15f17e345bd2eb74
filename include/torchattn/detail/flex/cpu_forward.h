#pragma once

// flex_attention's forward on the CPU (flex_attention.h), a template the caller's
// translation unit instantiates with its own score_mod and mask_mod, so that the
// compiler inlines them into the loops. float32 runs the tiled SIMD kernel
// (cpu_forward_tiles.h); float64, the precision of references, runs forward_rows below:
// each task one block of queries of one batch and head (kernels::cpu::parallel_for over them),
// each query row an online softmax over the blocks of keys its block mask keeps (the
// full blocks without mask_mod, then the partial ones with it; empty blocks never
// read), one key at a time.

#include <torchattn/flex/block_mask.h>
#include <torchattn/detail/flex/cpu_forward_tiles.h>
#include <torchattn/flex/inputs.h>

#include <torchattn/detail/kernels/cpu/parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

namespace torchattn::flex {

/// The forward for element type T (double; float too, one key at a time): out [B, H, Tq, Dv] and lse [B, H,
/// Tq] as flex_attention.h says, the scores, the softmax and the weighted sum in T.
template <class T, class ScoreMod, class MaskMod>
void forward_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Shapes& s,
                  const ScoreMod& score_mod, const BlockMask<MaskMod>& mask, T* out, T* lse) {
  const T* qp = q.const_data_ptr<T>();
  const T* kp = k.const_data_ptr<T>();
  const T* vp = v.const_data_ptr<T>();
  const auto qs = q.strides(), ks = k.strides(), vs = v.strides();
  const int64_t bs = mask.shape.block_size, nq = mask.shape.q_blocks();
  const int64_t group = s.H / s.Hkv;
  const T scale = static_cast<T>(s.scale);
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  kernels::cpu::parallel_for(0, s.B * s.H * nq, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> scores(static_cast<size_t>(bs)), acc(static_cast<size_t>(s.Dv));
    for (int64_t task = begin; task < end; ++task) {
      const int64_t qb = task % nq, h = (task / nq) % s.H, b = task / (nq * s.H), hk = h / group;
      const auto blocks = mask.key_blocks(b, h, qb);
      const T* kh = kp + b * ks[0] + hk * ks[1];
      const T* vh = vp + b * vs[0] + hk * vs[1];
      for (int64_t i = qb * bs; i < std::min(s.Tq, (qb + 1) * bs); ++i) {
        const T* qi = qp + b * qs[0] + h * qs[1] + i * qs[2];
        T m = kNegInf, l = 0;
        bool nan = false;
        std::fill(acc.begin(), acc.end(), T(0));
        for (int kind = 0; kind < 2; ++kind) {  // 0: full blocks, 1: partial ones
          for (int32_t c = 0; c < blocks.count[kind]; ++c) {
            const int64_t j0 = static_cast<int64_t>(blocks.index[kind][c]) * bs, j1 = std::min(s.Tk, j0 + bs);
            T block_max = kNegInf;
            for (int64_t j = j0; j < j1; ++j) {
              T sc = kNegInf;
              if (kind == 0 || mask.visible(b, h, i, j)) {
                const T* kj = kh + j * ks[2];
                T d = 0;
                for (int64_t e = 0; e < s.D; ++e) d += qi[e * qs[3]] * kj[e * ks[3]];
                sc = static_cast<T>(score_mod(d * scale, b, h, i, j));
                if (std::isnan(sc) || sc == std::numeric_limits<T>::infinity()) nan = true;
              }
              scores[static_cast<size_t>(j - j0)] = sc;
              block_max = std::max(block_max, sc);
            }
            if (nan || block_max == kNegInf) continue;
            const T m_new = std::max(m, block_max), rescale = std::exp(m - m_new);
            l *= rescale;
            for (auto& a : acc) a *= rescale;
            for (int64_t j = j0; j < j1; ++j) {
              const T sc = scores[static_cast<size_t>(j - j0)];
              if (sc == kNegInf) continue;
              const T p = std::exp(sc - m_new);
              l += p;
              const T* vj = vh + j * vs[2];
              for (int64_t e = 0; e < s.Dv; ++e) acc[static_cast<size_t>(e)] += p * vj[e * vs[3]];
            }
            m = m_new;
          }
        }
        T* o = out + ((b * s.H + h) * s.Tq + i) * s.Dv;
        T* r = lse + (b * s.H + h) * s.Tq + i;
        if (nan) {
          std::fill(o, o + s.Dv, std::numeric_limits<T>::quiet_NaN());
          *r = std::numeric_limits<T>::quiet_NaN();
        } else if (l == T(0)) {  // no key seen: zeros, lse -inf
          std::fill(o, o + s.Dv, T(0));
          *r = kNegInf;
        } else {
          for (int64_t e = 0; e < s.Dv; ++e) o[e] = acc[static_cast<size_t>(e)] / l;
          *r = m + std::log(l);
        }
      }
    }
  });
}

/// out and lse of flex_attention (checked inputs, sizes s).
template <class ScoreMod, class MaskMod>
std::tuple<at::Tensor, at::Tensor> cpu_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                               const Shapes& s, const ScoreMod& score_mod,
                                               const BlockMask<MaskMod>& mask) {
  at::Tensor out = at::empty({s.B, s.H, s.Tq, s.Dv}, q.options());
  at::Tensor lse = at::empty({s.B, s.H, s.Tq}, q.options());
  if (q.scalar_type() == at::kDouble) {
    forward_rows<double>(q, k, v, s, score_mod, mask, out.mutable_data_ptr<double>(), lse.mutable_data_ptr<double>());
  } else {
    forward_tiles(q, k, v, s, score_mod, mask, out, lse);
  }
  return {out, lse};
}

}  // namespace torchattn::flex

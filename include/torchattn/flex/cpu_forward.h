#pragma once

// flex_attention's forward on the CPU (flex_attention.h), a template the caller's
// translation unit instantiates with its own score_mod and mask_mod, so that the
// compiler inlines them into the loops. Each task is one block of queries of one batch
// and head (at::parallel_for over them); each query row runs an online softmax over the
// blocks of keys its block mask keeps: the full blocks without mask_mod, then the
// partial ones with it; empty blocks are never read.

#include <torchattn/flex/block_mask.h>

#include <ATen/Parallel.h>
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

/// The sizes of one flex_attention call.
struct Shapes {
  int64_t B, H, Hkv, Tq, Tk, D, Dv;
  double scale;
};

/// The checks of flex_attention's inputs against each other and against the block
/// mask's shape; returns the sizes and the scale (1 / sqrt(D) unless given).
inline Shapes check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const BlockMaskShape& mask,
                           std::optional<double> scale) {
  TORCH_CHECK(q.defined() && k.defined() && v.defined(), "flex_attention: expected defined q, k and v");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "flex_attention: expected q, k and v of 4 dimensions [B, H, T, D], got ", q.dim(), ", ", k.dim(), " and ",
              v.dim());
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(),
              "flex_attention: expected CPU tensors (the CUDA kernel is not written yet), got q on ", q.device(),
              ", k on ", k.device(), ", v on ", v.device());
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble,
              "flex_attention: expected q of float32 or float64, got ", q.scalar_type());
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
              "flex_attention: expected q, k and v of one dtype, got ", q.scalar_type(), ", ", k.scalar_type(), " and ",
              v.scalar_type());
  const Shapes s{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), v.size(3), 0.0};
  TORCH_CHECK(k.size(0) == s.B && v.size(0) == s.B, "flex_attention: expected k and v of batch ", s.B, " (q's), got ",
              k.size(0), " and ", v.size(0));
  TORCH_CHECK(v.size(1) == s.Hkv && v.size(2) == s.Tk, "flex_attention: expected v of ", s.Hkv, " heads and ", s.Tk,
              " positions (k's), got ", v.size(1), " and ", v.size(2));
  TORCH_CHECK(k.size(3) == s.D, "flex_attention: expected k of head size ", s.D, " (q's), got ", k.size(3));
  TORCH_CHECK(s.Hkv >= 1 && s.H % s.Hkv == 0, "flex_attention: expected q's heads (", s.H, ") a multiple of k's (",
              s.Hkv, ")");
  TORCH_CHECK(s.Tq >= 1 && s.Tk >= 1 && s.D >= 1, "flex_attention: expected at least one query, key and feature, got ",
              s.Tq, " queries, ", s.Tk, " keys, head size ", s.D);
  TORCH_CHECK((mask.batch == 1 || mask.batch == s.B) && (mask.heads == 1 || mask.heads == s.H) && mask.q_len == s.Tq &&
                  mask.kv_len == s.Tk,
              "flex_attention: block_mask was made for B ", mask.batch, ", H ", mask.heads, ", q_len ", mask.q_len,
              " and kv_len ", mask.kv_len, ", got q of B ", s.B, ", H ", s.H, " and ", s.Tq, " positions and k of ",
              s.Tk, " (make it with create_block_mask for these sizes; B or H of 1 serve any)");
  const double sc = scale.value_or(1.0 / std::sqrt(static_cast<double>(s.D)));
  TORCH_CHECK(std::isfinite(sc), "flex_attention: expected a finite scale, got ", sc);
  return {s.B, s.H, s.Hkv, s.Tq, s.Tk, s.D, s.Dv, sc};
}

/// The forward for element type T (float or double): out [B, H, Tq, Dv] and lse [B, H,
/// Tq] as flex_attention.h says, the scores, the softmax and the weighted sum in T.
template <class T, class ScoreMod, class MaskMod>
void forward_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Shapes& s,
                  const ScoreMod& score_mod, const BlockMask<MaskMod>& mask, T* out, T* lse) {
  const T* qp = q.const_data_ptr<T>();
  const T* kp = k.const_data_ptr<T>();
  const T* vp = v.const_data_ptr<T>();
  const auto qs = q.strides(), ks = k.strides(), vs = v.strides();
  const int64_t bs = mask.shape.block_size, nq = mask.shape.q_blocks(), nk = mask.shape.kv_blocks();
  const int32_t* partial_count = mask.kv_num_blocks.template const_data_ptr<int32_t>();
  const int32_t* partial_index = mask.kv_indices.template const_data_ptr<int32_t>();
  const int32_t* full_count = mask.full_kv_num_blocks.template const_data_ptr<int32_t>();
  const int32_t* full_index = mask.full_kv_indices.template const_data_ptr<int32_t>();
  const int64_t group = s.H / s.Hkv;
  const T scale = static_cast<T>(s.scale);
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  at::parallel_for(0, s.B * s.H * nq, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> scores(static_cast<size_t>(bs)), acc(static_cast<size_t>(s.Dv));
    for (int64_t task = begin; task < end; ++task) {
      const int64_t qb = task % nq, h = (task / nq) % s.H, b = task / (nq * s.H), hk = h / group;
      const int64_t row = ((mask.shape.batch == 1 ? 0 : b) * mask.shape.heads + (mask.shape.heads == 1 ? 0 : h)) * nq +
                          qb;
      const int32_t* blocks[2] = {full_index + row * nk, partial_index + row * nk};
      const int32_t counts[2] = {full_count[row], partial_count[row]};
      const T* kh = kp + b * ks[0] + hk * ks[1];
      const T* vh = vp + b * vs[0] + hk * vs[1];
      for (int64_t i = qb * bs; i < std::min(s.Tq, (qb + 1) * bs); ++i) {
        const T* qi = qp + b * qs[0] + h * qs[1] + i * qs[2];
        T m = kNegInf, l = 0;
        bool nan = false;
        std::fill(acc.begin(), acc.end(), T(0));
        for (int kind = 0; kind < 2; ++kind) {  // 0: full blocks, 1: partial ones
          for (int32_t c = 0; c < counts[kind]; ++c) {
            const int64_t j0 = static_cast<int64_t>(blocks[kind][c]) * bs, j1 = std::min(s.Tk, j0 + bs);
            T block_max = kNegInf;
            for (int64_t j = j0; j < j1; ++j) {
              T sc = kNegInf;
              if (kind == 0 || mask.mask_mod(b, h, i, j)) {
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
    forward_rows<float>(q, k, v, s, score_mod, mask, out.mutable_data_ptr<float>(), lse.mutable_data_ptr<float>());
  }
  return {out, lse};
}

}  // namespace torchattn::flex

#pragma once

// What one flex_attention call (flex_attention.h) is given: its sizes and scale, checked
// against each other and against the block mask, and the score_mod that keeps a score.

#include <torchattn/flex/block_mask.h>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstdint>
#include <optional>

namespace torchattn {

/// A score_mod that keeps the score (flex_attention without one; the kernels skip it).
struct IdentityScore {
  template <class T>
  T operator()(T score, int64_t /*b*/, int64_t /*h*/, int64_t /*q_idx*/, int64_t /*kv_idx*/) const {
    return score;
  }
};

namespace flex {

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

}  // namespace flex

}  // namespace torchattn

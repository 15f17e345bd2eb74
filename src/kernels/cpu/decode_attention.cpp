#include "kernels/cpu/decode_attention.h"

#include "kernels/cpu/float_operand.h"
#include "kernels/cpu/needs_grad.h"
#include <torchattn/detail/kernels/cpu/row_softmax.h>
#include <torchattn/detail/kernels/cpu/simd.h>
#include "kernels/cpu/stall_aware.h"
#include "kernels/cpu/vec.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace torchattn::kernels::cpu {

namespace {

TORCHATTN_SIMD_KERNELS_BEGIN

// One row's numerators in place (the row one block of RowSoftmax); returns 1 / their sum.
struct Softmax {
  static constexpr Isa kWidest = Isa::Avx512;
  template <class S>
  static float run(float* s, int64_t n) {
    RowSoftmax<S> row;
    row.add(s, n);
    return row.inverse();
  }
};

TORCHATTN_SIMD_KERNELS_END

}  // namespace

bool decode_attention_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask) {
  if (!float_operand(q, 4) || !float_operand(k, 4) || !float_operand(v, 4)) return false;
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), d = q.size(3);
  if (Tq < 1 || Tq > kDecodeAttentionRows || B < 1 || H < 1 || d < 1) return false;
  if (k.size(0) != B || v.size(0) != B || k.size(1) < 1 || H % k.size(1) != 0 || v.size(1) != k.size(1) ||
      k.size(3) != d || v.size(2) != k.size(2) || k.size(2) < 1 || v.size(3) < 1) {
    return false;
  }
  if (needs_grad(q) || needs_grad(k) || needs_grad(v) || needs_grad(mask)) return false;
  if (mask.defined()) {
    if (!mask.is_cpu() || mask.layout() != at::kStrided || mask.dim() > 4 ||
        (mask.scalar_type() != at::kBool && mask.scalar_type() != at::kFloat)) {
      return false;
    }
    const int64_t want[4] = {B, H, Tq, k.size(2)};
    for (int64_t i = 0; i < mask.dim(); ++i) {
      const int64_t s = mask.size(mask.dim() - 1 - i), w = want[3 - i];
      if (s != w && s != 1) return false;
    }
  }
  return true;
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask_in,
                            double scale) {
  TORCH_CHECK(decode_attention_applies(q, k, v, mask_in),
              "decode_attention: expected float32 CPU q [B, H, Tq <= ", kDecodeAttentionRows,
              ", d], k and v of matching shapes, and no gradient");
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), d = q.size(3);
  const int64_t Hkv = k.size(1), G = H / Hkv, Tk = k.size(2), dv = v.size(3);
  at::Tensor out = at::empty({B, H, Tq, dv}, q.options());
  // The mask as [B, H, Tq, Tk] strides (0 where it broadcasts).
  at::Tensor mask;
  if (mask_in.defined()) {
    mask = mask_in;
    while (mask.dim() < 4) mask = mask.unsqueeze(0);
    mask = mask.expand({B, H, Tq, Tk});
  }
  const bool bool_mask = mask.defined() && mask.scalar_type() == at::kBool;
  const float* qp = q.const_data_ptr<float>();
  const float* kp = k.const_data_ptr<float>();
  const float* vp = v.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  const auto qs = q.strides(), ks = k.strides(), vs = v.strides();
  const int64_t ms[4] = {mask.defined() ? mask.stride(0) : 0, mask.defined() ? mask.stride(1) : 0,
                         mask.defined() ? mask.stride(2) : 0, mask.defined() ? mask.stride(3) : 0};
  const bool* mb = bool_mask ? mask.const_data_ptr<bool>() : nullptr;
  const float* mf = mask.defined() && !bool_mask ? mask.const_data_ptr<float>() : nullptr;
  const float fscale = static_cast<float>(scale);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const Isa isa = best_isa();

  auto rows = [&](int64_t begin, int64_t end) {
    std::vector<float> scores(Tk);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / (H * Tq), h = row / Tq % H, t = row % Tq, hk = h / G;
      const float* qr = qp + b * qs[0] + h * qs[1] + t * qs[2];
      const float* kb = kp + b * ks[0] + hk * ks[1];
      const float* vb = vp + b * vs[0] + hk * vs[1];
      const int64_t moff = b * ms[0] + h * ms[1] + t * ms[2];
      // Only the keys from the first visible to the last are read: over a static cache
      // a row sees the first keys of the capacity, whose unwritten slots hold anything.
      auto visible = [&](int64_t j) {
        return mb != nullptr ? mb[moff + j * ms[3]] : mf == nullptr || mf[moff + j * ms[3]] != kNegInf;
      };
      int64_t lo = 0, hi = Tk;
      while (lo < hi && !visible(lo)) ++lo;
      while (hi > lo && !visible(hi - 1)) --hi;
      float* o = op + row * dv;
      std::fill(o, o + dv, 0.0f);
      if (lo == hi) continue;  // no key to see: zeros
      // Their products in one call (a hidden key's among them is overwritten below).
      dots(qr, kb + lo * ks[2], ks[2], hi - lo, d, scores.data() + lo);
      for (int64_t j = lo; j < hi; ++j) {
        float s;
        if (mb != nullptr && !mb[moff + j * ms[3]]) {
          s = kNegInf;
        } else {
          s = scores[j] * fscale;
          if (mf != nullptr) s += mf[moff + j * ms[3]];
        }
        scores[j] = s;
      }
      // The numerators in place (a hidden key's is 0: axpys skips it, its value unread).
      const float inv = simd::run_on<Softmax>(isa, scores.data() + lo, hi - lo);
      if (inv == 0.0f) continue;  // no key to see: zeros
      axpys(scores.data() + lo, vb + lo * vs[2], vs[2], hi - lo, o, dv);
      for (int64_t i = 0; i < dv; ++i) o[i] *= inv;
    }
  };
  parallel_for_work(B * H * Tq, Tk * (d + dv), rows);
  return out;
}

}  // namespace torchattn::kernels::cpu

#include "kernels/cpu/rotary.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cstdint>

namespace torchattn::kernels::cpu {

namespace {

// Rotates every head of every token by its position's angle; sign = -1 turns back.
// Each product and each difference is rounded to scalar_t, as separate ATen ops do.
template <typename scalar_t>
void rotate(const at::Tensor& x, at::Tensor& out, const at::Tensor& positions, const at::Tensor& cos,
            const at::Tensor& sin, int64_t rot, bool interleaved, float sign) {
  const int64_t B = x.size(0), T = x.size(1), G = x.size(2), hd = x.size(3), half = rot / 2;
  const int64_t pos_batch = positions.dim() == 2 && positions.size(0) > 1 ? T : 0;
  const scalar_t* src = x.const_data_ptr<scalar_t>();
  scalar_t* dst = out.mutable_data_ptr<scalar_t>();
  const int64_t* pos = positions.const_data_ptr<int64_t>();
  const float* cos_table = cos.const_data_ptr<float>();
  const float* sin_table = sin.const_data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, G * hd));
  at::parallel_for(0, B * T, grain, [&](int64_t begin, int64_t end) {
    for (int64_t bt = begin; bt < end; ++bt) {
      const int64_t p = pos[(bt / T) * pos_batch + bt % T];
      const float* c = cos_table + p * half;
      const float* s = sin_table + p * half;
      for (int64_t g = 0; g < G; ++g) {
        const scalar_t* in = src + (bt * G + g) * hd;
        scalar_t* o = dst + (bt * G + g) * hd;
        for (int64_t i = 0; i < half; ++i) {
          const scalar_t ci = static_cast<scalar_t>(c[i]), si = static_cast<scalar_t>(sign * s[i]);
          const int64_t a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
          const scalar_t x1 = in[a], x2 = in[b];
          const scalar_t x1c = x1 * ci, x2s = x2 * si, x2c = x2 * ci, x1s = x1 * si;
          o[a] = x1c - x2s;
          o[b] = x2c + x1s;
        }
        std::copy(in + rot, in + hd, o + rot);
      }
    }
  });
}

at::Tensor rotated(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos, const at::Tensor& sin,
                   int64_t rot, bool interleaved, float sign) {
  at::Tensor out = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "torchattn_rotary",
                                  [&] { rotate<scalar_t>(x, out, positions, cos, sin, rot, interleaved, sign); });
  return out;
}

struct Rotary : public torch::autograd::Function<Rotary> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& positions,
                            const at::Tensor& cos, const at::Tensor& sin, int64_t rot, bool interleaved, double sign) {
    ctx->save_for_backward({positions, cos, sin});
    ctx->saved_data["rot"] = rot;
    ctx->saved_data["interleaved"] = interleaved;
    ctx->saved_data["sign"] = sign;
    return rotated(x, positions, cos, sin, rot, interleaved, static_cast<float>(sign));
  }

  // The rotation's transpose is the rotation by the opposite angle.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor grad = apply(grads[0].contiguous(), saved[0], saved[1], saved[2], ctx->saved_data["rot"].toInt(),
                                  ctx->saved_data["interleaved"].toBool(), -ctx->saved_data["sign"].toDouble());
    return {grad, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor rotary(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos, const at::Tensor& sin,
                  int64_t rotary_dim, bool interleaved) {
  TORCH_CHECK(x.dim() == 4 && x.is_contiguous() && x.is_cpu(),
              "rotary: expected a contiguous CPU x of shape "
              "[B, T, G, head_dim], got ",
              x.sizes());
  TORCH_CHECK(rotary_dim >= 2 && rotary_dim % 2 == 0 && rotary_dim <= x.size(3),
              "rotary: expected an even rotary_dim in [2, head_dim = ", x.size(3), "], got ", rotary_dim);
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_cpu() && positions.is_contiguous() &&
                  positions.size(-1) == x.size(1),
              "rotary: expected contiguous int64 CPU positions of [T] or [B, T] with T=", x.size(1), ", got ",
              positions.sizes());
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.scalar_type() == at::kFloat &&
                  cos.size(1) == rotary_dim / 2 && sin.sizes() == cos.sizes(),
              "rotary: expected float32 cos and sin tables of [length, ", rotary_dim / 2, "], got ", cos.sizes());
  // The kernel reads table rows by position: each must be one (a pass over B x T
  // integers on the CPU, nothing next to the attention).
  TORCH_CHECK(positions.numel() == 0 ||
                  (positions.min().item<int64_t>() >= 0 && positions.max().item<int64_t>() < cos.size(0)),
              "rotary: expected positions in [0, ", cos.size(0), ")");
  return Rotary::apply(x, positions, cos, sin, rotary_dim, interleaved, 1.0);
}

}  // namespace torchattn::kernels::cpu

#include <torchattn/rms_norm.h>

#include <ATen/Parallel.h>
#include <ATen/ops/empty_like.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>

namespace torchattn {

RMSNormImpl::RMSNormImpl(int64_t size, double eps_, bool unit_offset_) : eps(eps_), unit_offset(unit_offset_) {
  weight = register_parameter("weight", unit_offset ? at::zeros({size}) : at::ones({size}));
}

namespace {

// RMSNorm of float32 CPU rows in one pass each (no gradient): the sum of squares in
// double, then x * rsqrt(mean + eps) * weight, as transformers' LlamaRMSNorm computes
// it in float32 (equal within float32 rounding). The composite below costs five
// passes and four temporaries of x's size.
bool fused_rms_norm_applies(const at::Tensor& x, const at::Tensor& weight) {
  const bool grad = c10::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad());
  return !grad && x.is_cpu() && weight.is_cpu() && x.scalar_type() == at::kFloat &&
         weight.scalar_type() == at::kFloat && weight.is_contiguous() && x.dim() >= 1 && x.size(-1) == weight.numel();
}

at::Tensor fused_rms_norm(const at::Tensor& x_in, const at::Tensor& weight, double eps) {
  const at::Tensor x = x_in.contiguous();
  at::Tensor y = at::empty_like(x);
  const int64_t n = x.size(-1), rows = n == 0 ? 0 : x.numel() / n;
  const float* xs = x.const_data_ptr<float>();
  const float* w = weight.const_data_ptr<float>();
  float* ys = y.mutable_data_ptr<float>();
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = xs + r * n;
      float* yr = ys + r * n;
      double sum = 0.0;
      for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(xr[i]) * xr[i];
      const float variance = static_cast<float>(sum / static_cast<double>(n));
      const float inv = 1.0f / std::sqrt(variance + static_cast<float>(eps));
      for (int64_t i = 0; i < n; ++i) yr[i] = w[i] * (xr[i] * inv);
    }
  });
  return y;
}

}  // namespace

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  if (fused_rms_norm_applies(x, weight)) {
    return fused_rms_norm(x, unit_offset ? (weight + 1.0).contiguous() : weight, eps);
  }
  const at::Tensor h = x.to(at::kFloat);
  const at::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  if (unit_offset) return ((h * at::rsqrt(variance + eps)) * (weight.to(at::kFloat) + 1.0)).to(x.scalar_type());
  return weight * (h * at::rsqrt(variance + eps)).to(x.scalar_type());
}

}  // namespace torchattn

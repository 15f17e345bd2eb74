#include "linear.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#if defined(__x86_64__) || defined(__i386__)
#define TORCHATTN_LINEAR_X86 1
#include <immintrin.h>
#endif

#include <algorithm>
#include <vector>

namespace torchattn::kernels::cpu {

namespace {

#if defined(TORCHATTN_LINEAR_X86)
// dot(w, x) over n floats; AVX2 and FMA where the CPU has them.
__attribute__((target("avx2,fma"))) float dot_avx2(const float* w, const float* x, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 16), _mm256_loadu_ps(x + i + 16), a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 24), _mm256_loadu_ps(x + i + 24), a3);
  }
  for (; i + 8 <= n; i += 8) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
  }
  const __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_hadd_ps(h, h);
  h = _mm_hadd_ps(h, h);
  float total = _mm_cvtss_f32(h);
  for (; i < n; ++i) total += w[i] * x[i];
  return total;
}
#endif

float dot_scalar(const float* w, const float* x, int64_t n) {
  float total = 0.0f;
  for (int64_t i = 0; i < n; ++i) total += w[i] * x[i];
  return total;
}

#if defined(TORCHATTN_LINEAR_X86)
bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}
float dot(bool avx2, const float* w, const float* x, int64_t n) {
  return avx2 ? dot_avx2(w, x, n) : dot_scalar(w, x, n);
}
#else
// Other architectures: the scalar loop (the compiler vectorizes what it can).
bool has_avx2() { return false; }
float dot(bool, const float* w, const float* x, int64_t n) { return dot_scalar(w, x, n); }
#endif

} // namespace

int64_t plain_linear_rows(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  auto plain = [](const at::Tensor& t) {
    return t.is_cpu() && t.scalar_type() == at::kFloat && t.layout() == at::kStrided && !t.is_nested();
  };
  if (!plain(x) || !plain(weight) || weight.dim() != 2 || !weight.is_contiguous() || x.dim() < 1 ||
      x.size(-1) != weight.size(1) || weight.numel() == 0) {
    return -1;
  }
  if (bias.defined() && (!plain(bias) || bias.dim() != 1 || bias.size(0) != weight.size(0) || !bias.is_contiguous())) {
    return -1;
  }
  auto needs_grad = [](const at::Tensor& t) {
    return t.defined() && ((c10::GradMode::is_enabled() && t.requires_grad()) || t._fw_grad(/*level=*/0).defined());
  };
  if (needs_grad(x) || needs_grad(weight) || needs_grad(bias)) return -1;
  return x.numel() / x.size(-1);
}

bool small_linear_applies(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  const int64_t rows = plain_linear_rows(x, weight, bias);
  return rows >= 1 && rows <= kSmallLinearRows;
}

at::Tensor small_linear(const at::Tensor& x_in, const at::Tensor& weight, const at::Tensor& bias) {
  TORCH_CHECK(small_linear_applies(x_in, weight, bias), "small_linear: expected a few float32 CPU rows and no gradient");
  const at::Tensor x = x_in.contiguous();
  const int64_t in = weight.size(1), out = weight.size(0), rows = x.numel() / in;
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = out;
  at::Tensor y = at::empty(shape, x.options());
  const float* w = weight.const_data_ptr<float>();
  const float* xs = x.const_data_ptr<float>();
  const float* b = bias.defined() ? bias.const_data_ptr<float>() : nullptr;
  float* ys = y.mutable_data_ptr<float>();
  const bool avx2 = has_avx2();
  // Output features split over the threads; each weight row is read once and
  // dotted with every row of x (which stays in cache).
  const int64_t grain = std::max<int64_t>(16, 16384 / std::max<int64_t>(in, 1));
  at::parallel_for(0, out, grain, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      const float* wo = w + o * in;
      for (int64_t r = 0; r < rows; ++r) {
        const float d = dot(avx2, wo, xs + r * in, in);
        ys[r * out + o] = b != nullptr ? d + b[o] : d;
      }
    }
  });
  return y;
}

} // namespace torchattn::kernels::cpu

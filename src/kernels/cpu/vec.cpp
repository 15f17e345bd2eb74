#include "kernels/cpu/vec.h"

#if defined(__x86_64__) || defined(__i386__)
#define TORCHATTN_VEC_X86 1
#include <immintrin.h>
#endif

namespace torchattn::kernels::cpu {

namespace {

float dot_scalar(const float* a, const float* b, int64_t n) {
  float total = 0.0f;
  for (int64_t i = 0; i < n; ++i) total += a[i] * b[i];
  return total;
}

void axpy_scalar(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

#if defined(TORCHATTN_VEC_X86)
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

__attribute__((target("avx2,fma"))) void axpy_avx2(float alpha, const float* x, float* y, int64_t n) {
  const __m256 a = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(a, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += alpha * x[i];
}
#endif

}  // namespace

#if defined(TORCHATTN_VEC_X86)
bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}
float dot(const float* a, const float* b, int64_t n) { return has_avx2() ? dot_avx2(a, b, n) : dot_scalar(a, b, n); }
void axpy(float alpha, const float* x, float* y, int64_t n) {
  has_avx2() ? axpy_avx2(alpha, x, y, n) : axpy_scalar(alpha, x, y, n);
}
#else
// Other architectures: the scalar loops (the compiler vectorizes what it can).
bool has_avx2() { return false; }
float dot(const float* a, const float* b, int64_t n) { return dot_scalar(a, b, n); }
void axpy(float alpha, const float* x, float* y, int64_t n) { axpy_scalar(alpha, x, y, n); }
#endif

}  // namespace torchattn::kernels::cpu

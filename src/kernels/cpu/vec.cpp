#include "kernels/cpu/vec.h"

#include "kernels/cpu/simd.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace torchattn::kernels::cpu {

namespace {

TORCHATTN_SIMD_KERNELS_BEGIN

struct Dot {
  static constexpr Isa kWidest = Isa::Avx2;
  // sum_i a[i] * b[i] over n floats: W-lane FMAs (none for one lane), then the rest
  // one by one (see vec.h).
  template <class S>
  static float run(const float* a, const float* b, int64_t n) {
    using V = typename S::V;
    constexpr int64_t W = S::W;
    int64_t i = 0;
    float total = 0.0f;
    if constexpr (W > 1) {
      V a0 = S::zero(), a1 = a0, a2 = a0, a3 = a0;
      for (; i + 4 * W <= n; i += 4 * W) {
        a0 = S::fma(S::load(a + i), S::load(b + i), a0);
        a1 = S::fma(S::load(a + i + W), S::load(b + i + W), a1);
        a2 = S::fma(S::load(a + i + 2 * W), S::load(b + i + 2 * W), a2);
        a3 = S::fma(S::load(a + i + 3 * W), S::load(b + i + 3 * W), a3);
      }
      for (; i + W <= n; i += W) a0 = S::fma(S::load(a + i), S::load(b + i), a0);
      total = S::reduce_add_adjacent(S::add(S::add(a0, a1), S::add(a2, a3)));
    }
    for (; i < n; ++i) total += a[i] * b[i];
    return total;
  }
};

struct Axpy {
  static constexpr Isa kWidest = Isa::Avx2;
  // y[i] += alpha * x[i] over n floats: W lanes at a time (FMA), then one by one.
  template <class S>
  static void run(float alpha, const float* x, float* y, int64_t n) {
    int64_t i = 0;
    if constexpr (S::W > 1) {
      const typename S::V a = S::set1(alpha);
      for (; i + S::W <= n; i += S::W) S::store(y + i, S::fma(a, S::load(x + i), S::load(y + i)));
    }
    for (; i < n; ++i) y[i] += alpha * x[i];
  }
};

// dots() and axpys(): Dot and Axpy over rows, inlined, so one dispatch serves them all.
struct Dots {
  static constexpr Isa kWidest = Dot::kWidest;
  template <class S>
  static void run(const float* a, const float* b, int64_t stride, int64_t count, int64_t n, float* out) {
    for (int64_t j = 0; j < count; ++j) out[j] = Dot::run<S>(a, b + j * stride, n);
  }
};

struct Axpys {
  static constexpr Isa kWidest = Axpy::kWidest;
  template <class S>
  static void run(const float* alpha, const float* x, int64_t stride, int64_t count, float* y, int64_t n) {
    for (int64_t j = 0; j < count; ++j) {
      if (alpha[j] != 0.0f) Axpy::run<S>(alpha[j], x + j * stride, y, n);
    }
  }
};

TORCHATTN_SIMD_KERNELS_END

void check_isa(Isa isa, const char* fn) {
  TORCH_CHECK(isa <= vec_isa(), fn, ": expected an instruction set up to ", isa_name(vec_isa()), ", got ",
              isa_name(isa));
}

}  // namespace

Isa vec_isa() {
  static const Isa isa = std::min(best_isa(), Dot::kWidest);
  return isa;
}

float dot(const float* a, const float* b, int64_t n) { return simd::run_on<Dot>(vec_isa(), a, b, n); }

float dot(const float* a, const float* b, int64_t n, Isa isa) {
  check_isa(isa, "dot");
  return simd::run_on<Dot>(isa, a, b, n);
}

void axpy(float alpha, const float* x, float* y, int64_t n) { simd::run_on<Axpy>(vec_isa(), alpha, x, y, n); }

void axpy(float alpha, const float* x, float* y, int64_t n, Isa isa) {
  check_isa(isa, "axpy");
  simd::run_on<Axpy>(isa, alpha, x, y, n);
}

void dots(const float* a, const float* b, int64_t stride, int64_t count, int64_t n, float* out) {
  simd::run_on<Dots>(vec_isa(), a, b, stride, count, n, out);
}

void axpys(const float* alpha, const float* x, int64_t stride, int64_t count, float* y, int64_t n) {
  simd::run_on<Axpys>(vec_isa(), alpha, x, stride, count, y, n);
}

}  // namespace torchattn::kernels::cpu

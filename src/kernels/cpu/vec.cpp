#include "kernels/cpu/vec.h"

#include <torchattn/detail/kernels/cpu/simd.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>

namespace torchattn::kernels::cpu {

namespace {

TORCHATTN_SIMD_KERNELS_BEGIN

struct Dot {
  static constexpr Isa kWidest = Isa::Avx512;
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
  static constexpr Isa kWidest = Isa::Avx512;
  // y[i] += alpha * x[i] over n floats: W lanes at a time (FMA), then one by one, the
  // tail fused as well on the vector targets (std::fma: the same bits at every
  // optimization level, not left to the compiler's contraction), multiply then add on
  // the scalar one.
  template <class S>
  static void run(float alpha, const float* x, float* y, int64_t n) {
    int64_t i = 0;
    if constexpr (S::W > 1) {
      const typename S::V a = S::set1(alpha);
      for (; i + S::W <= n; i += S::W) S::store(y + i, S::fma(a, S::load(x + i), S::load(y + i)));
      for (; i < n; ++i) y[i] = std::fma(alpha, x[i], y[i]);
    } else {
      for (; i < n; ++i) y[i] += alpha * x[i];
    }
  }
};

// matvec(): R rows of w at once against one x (rows `stride` floats apart, outputs
// out_stride apart), each row summed as vec.h says, the same operations whatever R
// (the loads of x shared by the rows).
struct Matvec {
  static constexpr Isa kWidest = kMatvecWidest;
  template <class S, int R>
  static void rows(const float* x, const float* w, int64_t stride, int64_t n, float* out, int64_t out_stride) {
    using V = typename S::V;
    constexpr int64_t W = S::W;
    int64_t i = 0;
    float total[R] = {};
    if constexpr (W > 1) {
      V a[R], c[R];
      for (int r = 0; r < R; ++r) a[r] = c[r] = S::zero();
      for (; i + 2 * W <= n; i += 2 * W) {
        const V x0 = S::load(x + i), x1 = S::load(x + i + W);
        for (int r = 0; r < R; ++r) {
          a[r] = S::fma(x0, S::load(w + r * stride + i), a[r]);
          c[r] = S::fma(x1, S::load(w + r * stride + i + W), c[r]);
        }
      }
      if (i + W <= n) {
        const V x0 = S::load(x + i);
        for (int r = 0; r < R; ++r) a[r] = S::fma(x0, S::load(w + r * stride + i), a[r]);
        i += W;
      }
      for (int r = 0; r < R; ++r) total[r] = S::reduce_add_adjacent(S::add(a[r], c[r]));
    }
    for (int r = 0; r < R; ++r) {
      float t = total[r];
      for (int64_t k = i; k < n; ++k) {
        if constexpr (W > 1) {
          t = std::fma(x[k], w[r * stride + k], t);
        } else {
          t += x[k] * w[r * stride + k];
        }
      }
      out[r * out_stride] = t;
    }
  }
  // Four long streams of weights: the rows split in four runs of q, and row j of each
  // run summed together; the count % 4 rows left one at a time. One stream: every row
  // in turn.
  template <class S>
  static void run(const float* x, const float* w, int64_t n, int64_t count, float* out, int streams) {
    const int64_t q = streams == 4 ? count / 4 : 0;
    for (int64_t j = 0; j < q; ++j) rows<S, 4>(x, w + j * n, q * n, n, out + j, q);
    for (int64_t j = 4 * q; j < count; ++j) rows<S, 1>(x, w + j * n, n, n, out + j, 1);
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

struct NarrowHalves {
  static constexpr Isa kWidest = Isa::Avx512;
  template <class S>
  static void run(const float* x, int64_t n, uint16_t* out) {
    int64_t i = 0;
    if constexpr (S::W > 1) {
      for (; i + S::W <= n; i += S::W) S::narrow_halves(out + i, S::load(x + i));
    }
    for (; i < n; ++i) simd::Scalar::narrow_halves(out + i, x[i]);
  }
};

TORCHATTN_SIMD_KERNELS_END


}  // namespace

float dot(const float* a, const float* b, int64_t n) { return simd::run_on<Dot>(best_isa(), a, b, n); }

float dot(const float* a, const float* b, int64_t n, Isa isa) {
  check_isa_at_most(isa, best_isa(), "dot");
  return simd::run_on<Dot>(isa, a, b, n);
}

void axpy(float alpha, const float* x, float* y, int64_t n) { simd::run_on<Axpy>(best_isa(), alpha, x, y, n); }

void axpy(float alpha, const float* x, float* y, int64_t n, Isa isa) {
  check_isa_at_most(isa, best_isa(), "axpy");
  simd::run_on<Axpy>(isa, alpha, x, y, n);
}

void narrow_halves(const float* x, int64_t n, uint16_t* out) { simd::run_on<NarrowHalves>(best_isa(), x, n, out); }

void narrow_halves(const float* x, int64_t n, uint16_t* out, Isa isa) {
  check_isa_at_most(isa, best_isa(), "narrow_halves");
  simd::run_on<NarrowHalves>(isa, x, n, out);
}

void dots(const float* a, const float* b, int64_t stride, int64_t count, int64_t n, float* out) {
  simd::run_on<Dots>(best_isa(), a, b, stride, count, n, out);
}

int matvec_streams() {
  // Four streams where they measured faster (vec.h); one elsewhere, as before them.
  static const int streams = best_isa() != Isa::Scalar ? 4 : 1;
  return streams;
}

void matvec(const float* x, const float* w, int64_t n, int64_t count, float* out) {
  simd::run_on<Matvec>(best_isa(), x, w, n, count, out, matvec_streams());
}

void matvec(const float* x, const float* w, int64_t n, int64_t count, float* out, Isa isa, int streams) {
  check_isa_at_most(isa, best_isa(), "matvec");
  TORCH_CHECK(streams == 1 || streams == 4, "matvec: expected 1 or 4 streams, got ", streams);
  simd::run_on<Matvec>(isa, x, w, n, count, out, streams);
}

void axpys(const float* alpha, const float* x, int64_t stride, int64_t count, float* y, int64_t n) {
  simd::run_on<Axpys>(best_isa(), alpha, x, stride, count, y, n);
}

}  // namespace torchattn::kernels::cpu

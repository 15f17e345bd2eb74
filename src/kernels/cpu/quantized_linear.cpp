#include "kernels/cpu/quantized_linear.h"

#include "kernels/cpu/int4_rows.h"
#include "kernels/cpu/int8_products.h"
#include "kernels/cpu/needs_grad.h"
#include "kernels/cpu/onednn_linear.h"
#include <torchattn/detail/kernels/cpu/simd.h>
#include "kernels/cpu/stall_aware.h"

#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

TORCHATTN_SIMD_KERNELS_BEGIN

namespace torchattn::kernels::cpu {

namespace {

// The weights of one call: int8 (scales per group), int4 (a (d, m) pair per group of
// 32, int4_rows.h) or bfloat16 (none).
struct Weights {
  const void* q = nullptr;
  bool int8 = false;
  bool int4 = false;
  const float* scale = nullptr;  // [out, groups] for int8
  const uint16_t* dm = nullptr;  // [out, in / 32, 2] float16 for int4
  int64_t in = 0, out = 0, groups = 1;
};

// The inputs of a weight matrix: two a byte in int4's.
int64_t inputs_of(const at::Tensor& data) { return data.scalar_type() == at::kByte ? 2 * data.size(1) : data.size(1); }

Weights weights_of(const at::Tensor& data, const at::Tensor& scale) {
  Weights w;
  w.q = data.const_data_ptr();
  w.int8 = data.scalar_type() == at::kChar;
  w.int4 = data.scalar_type() == at::kByte;
  w.in = inputs_of(data);
  w.out = data.size(0);
  if (w.int8) {
    w.scale = scale.const_data_ptr<float>();
    w.groups = scale.size(1);
  } else if (w.int4) {
    w.dm = reinterpret_cast<const uint16_t*>(scale.const_data_ptr<at::Half>());
    w.groups = scale.size(1);
  }
  return w;
}

// out[0, n) = float(q[0, n)) (times s where given): int8 or bfloat16 (as its bits).
struct Widen {
  static constexpr Isa kWidest = Isa::Avx512;
  template <class S, class T>
  static void run(const T* q, float* out, int64_t n, float s, bool scaled) {
    int64_t i = 0;
    if (scaled) {
      const typename S::V sv = S::set1(s);
      for (; i + S::W <= n; i += S::W) S::store(out + i, S::mul(S::widen(q + i), sv));
      for (; i < n; ++i) out[i] = simd::Scalar::widen(q + i) * s;
    } else {
      for (; i + S::W <= n; i += S::W) S::store(out + i, S::widen(q + i));
      for (; i < n; ++i) out[i] = simd::Scalar::widen(q + i);
    }
  }
};

// Weight rows [begin, end) dequantized into out ([end - begin, in] floats): int8 each
// group times its scale, bfloat16 exact.
template <class T>
void dequantize_range(const Weights& w, int64_t begin, int64_t end, float* out) {
  const Isa isa = best_isa();
  const T* q = static_cast<const T*>(w.q);
  for (int64_t o = begin; o < end; ++o) {
    float* row = out + (o - begin) * w.in;
    if (w.scale == nullptr) {
      simd::run_on<Widen>(isa, q + o * w.in, row, w.in, 1.0f, false);
      continue;
    }
    for (int64_t g = 0; g < w.groups; ++g) {
      const int64_t g0 = g * kInt8Group, n = std::min(kInt8Group, w.in - g0);
      simd::run_on<Widen>(isa, q + o * w.in + g0, row + g0, n, w.scale[o * w.groups + g], true);
    }
  }
}

void dequantize_range(const Weights& w, int64_t begin, int64_t end, float* out) {
  if (w.int4) {
    int4::dequantize_rows(static_cast<const uint8_t*>(w.q), w.dm, w.in, begin, end, out);
  } else if (w.int8) {
    dequantize_range<int8_t>(w, begin, end, out);
  } else {
    dequantize_range<uint16_t>(w, begin, end, out);
  }
}

// out[k] = sum over groups g of scale[k][g] * sum_{i in g} float(q[k][i]) * x[i] for the
// four weight rows q[0..3] (scale null: bfloat16, one group, no scale): one pass over x
// for all four, each row widened in registers, four accumulators per group folded
// into four totals by the group's scale; a group's last n % W products in order.
struct DotFour {
  static constexpr Isa kWidest = Isa::Avx512;
  template <class S, class T>
  static void run(const T* const* q, const float* const* scale, const float* x, int64_t in, float* out) {
    using V = typename S::V;
    V t0 = S::zero(), t1 = S::zero(), t2 = S::zero(), t3 = S::zero();
    float tail[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int64_t group = scale != nullptr ? kInt8Group : in;
    for (int64_t g0 = 0, g = 0; g0 < in; g0 += group, ++g) {
      const int64_t g1 = std::min(in, g0 + group);
      V a0 = S::zero(), a1 = S::zero(), a2 = S::zero(), a3 = S::zero();
      int64_t i = g0;
      for (; i + S::W <= g1; i += S::W) {
        const V xv = S::load(x + i);
        a0 = S::fma(S::widen(q[0] + i), xv, a0);
        a1 = S::fma(S::widen(q[1] + i), xv, a1);
        a2 = S::fma(S::widen(q[2] + i), xv, a2);
        a3 = S::fma(S::widen(q[3] + i), xv, a3);
      }
      float rest[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (; i < g1; ++i) {
        for (int k = 0; k < 4; ++k) rest[k] += simd::Scalar::widen(q[k] + i) * x[i];
      }
      if (scale != nullptr) {
        t0 = S::fma(a0, S::set1(scale[0][g]), t0);
        t1 = S::fma(a1, S::set1(scale[1][g]), t1);
        t2 = S::fma(a2, S::set1(scale[2][g]), t2);
        t3 = S::fma(a3, S::set1(scale[3][g]), t3);
        for (int k = 0; k < 4; ++k) tail[k] += rest[k] * scale[k][g];
      } else {
        t0 = S::add(a0, t0);
        t1 = S::add(a1, t1);
        t2 = S::add(a2, t2);
        t3 = S::add(a3, t3);
        for (int k = 0; k < 4; ++k) tail[k] += rest[k];
      }
    }
    out[0] = S::reduce_add(t0) + tail[0];
    out[1] = S::reduce_add(t1) + tail[1];
    out[2] = S::reduce_add(t2) + tail[2];
    out[3] = S::reduce_add(t3) + tail[3];
  }
};

// out[k][r] = sum_i w[k][i] * x[r][i] for four weight rows q[0..3] and four rows of x
// x[0..3]: each weight vector widened once (times its group's scale, int8) and used for
// the four rows of x, sixteen accumulators; the last in % W products in order.
struct DotTile {
  static constexpr Isa kWidest = Isa::Avx512;
  template <class S, class T>
  static void run(const T* const* q, const float* const* scale, const float* const* x, int64_t in, float* out) {
    using V = typename S::V;
    V acc[4][4];
    for (auto& row : acc) {
      for (auto& a : row) a = S::zero();
    }
    float tail[4][4] = {};
    const int64_t group = scale != nullptr ? kInt8Group : in;
    for (int64_t g0 = 0, g = 0; g0 < in; g0 += group, ++g) {
      const int64_t g1 = std::min(in, g0 + group);
      V sv[4];
      for (int k = 0; k < 4; ++k) sv[k] = S::set1(scale != nullptr ? scale[k][g] : 1.0f);
      int64_t i = g0;
      for (; i + S::W <= g1; i += S::W) {
        V w[4];
        for (int k = 0; k < 4; ++k) w[k] = scale != nullptr ? S::mul(S::widen(q[k] + i), sv[k]) : S::widen(q[k] + i);
        for (int r = 0; r < 4; ++r) {
          const V xv = S::load(x[r] + i);
          for (int k = 0; k < 4; ++k) acc[k][r] = S::fma(w[k], xv, acc[k][r]);
        }
      }
      for (; i < g1; ++i) {
        for (int k = 0; k < 4; ++k) {
          const float wk = simd::Scalar::widen(q[k] + i) * (scale != nullptr ? scale[k][g] : 1.0f);
          for (int r = 0; r < 4; ++r) tail[k][r] += wk * x[r][i];
        }
      }
    }
    for (int k = 0; k < 4; ++k) {
      for (int r = 0; r < 4; ++r) out[k * 4 + r] = S::reduce_add(acc[k][r]) + tail[k][r];
    }
  }
};

// sum_i float(q[r][i]) * x[i] for bfloat16 weight rows and one row of x, each row: two
// accumulators over blocks of 2W, added and reduce_add, plus the last in % 2W products
// in order: the same operations for a row whatever R (rows() of R rows share x's loads).
// Which way the rows go, per instruction set (matvec_range):
// - AVX2 and AVX-512, four long streams (DotRows::run) without software prefetches.
//   AVX2 on an AMD EPYC Zen 3 (no AVX-512), medians of interleaved passes over every
//   layer's weights of a decoding step: a 1B model's (1.07 GB of bfloat16) read at 30.6
//   GB/s against 18.9 for one row after another with the prefetches below, 19.6 without
//   them, and 22.8 for four adjacent rows (2 threads), 20.7 against 12.5 (1 thread);
//   SmolLM2-135M's at 22.8 against 17.4 (2 threads), 16.9 against 12.1 (1 thread).
//   AVX-512 on an AMD EPYC Zen 5, the same passes (medians of 9): the 1B's at 46.1 and
//   51.4 GB/s against 42.6 and 43.9 for one row after another with the prefetches (2
//   threads, two runs), 35.5 against 33.7 (1 thread); SmolLM2-135M's at 46.8 against
//   45.5 (2 threads), 37.4 against 36.7 (1 thread). Not measured on an Intel Xeon.
// - Scalar, one row at a time, a software prefetch kOneRowAhead bytes down the one
//   stream (as AVX-512 did before four streams: there it kept more of the stream in
//   flight than the hardware prefetchers alone, 148.3, 137.5, 149.3 against 121.3,
//   121.8, 121.5 tokens/s for SmolLM2-135M in bfloat16, 2 threads, Zen 5).
constexpr int64_t kOneRowAhead = 8192;

struct DotRows {
  static constexpr Isa kWidest = Isa::Avx512;
  // R rows `stride` elements apart, their outputs out_stride apart.
  template <class S, int R>
  static void rows(const uint16_t* q, const float* x, int64_t stride, int64_t in, float* out, int64_t out_stride) {
    using V = typename S::V;
    V a0[R], a1[R];
    for (int r = 0; r < R; ++r) a0[r] = a1[r] = S::zero();
    int64_t i = 0;
    for (; i + 2 * S::W <= in; i += 2 * S::W) {
      const V x0 = S::load(x + i), x1 = S::load(x + i + S::W);
      for (int r = 0; r < R; ++r) {
        a0[r] = S::fma(S::widen(q + r * stride + i), x0, a0[r]);
        a1[r] = S::fma(S::widen(q + r * stride + i + S::W), x1, a1[r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      float t = 0.0f;
      for (int64_t k = i; k < in; ++k) t += simd::Scalar::widen(q + r * stride + k) * x[k];
      out[r * out_stride] = S::reduce_add(S::add(a0[r], a1[r])) + t;
    }
  }
  // Four long streams: the rows split in four runs of m, row j of each run summed
  // together; the count % 4 rows left one at a time.
  template <class S>
  static void run(const uint16_t* q, const float* x, int64_t in, int64_t count, float* out) {
    const int64_t m = count / 4;
    for (int64_t j = 0; j < m; ++j) rows<S, 4>(q + j * in, x, m * in, in, out + j, m);
    for (int64_t j = 4 * m; j < count; ++j) rows<S, 1>(q + j * in, x, in, in, out + j, 1);
  }
};

// Rows [begin, end) of y for x's `rows` rows: DotFour over four weight rows at a time
// (the last group of rows repeats its first row where fewer are left).
template <class T>
void fused_rows(const Weights& w, int64_t begin, int64_t end, const float* xs, int64_t rows, const float* bias,
                float* ys, int64_t ldy) {
  const Isa isa = best_isa();
  const T* q = static_cast<const T*>(w.q);
  const int64_t in = w.in;
  for (int64_t o = begin; o < end; o += 4) {
    const int64_t n = std::min<int64_t>(4, end - o);
    const T* ptrs[4];
    const float* scales[4];
    for (int64_t k = 0; k < 4; ++k) {
      const int64_t row = o + (k < n ? k : 0);
      ptrs[k] = q + row * in;
      scales[k] = w.scale != nullptr ? w.scale + row * w.groups : nullptr;
    }
    // The rows after next on their way from memory while these are summed: the
    // hardware prefetchers alone leave the weights' stream at half the bandwidth.
    if (o + 12 <= end) {
      const char* ahead = reinterpret_cast<const char*>(q + (o + 8) * in);
      for (int64_t b = 0; b < 4 * in * static_cast<int64_t>(sizeof(T)); b += 64) __builtin_prefetch(ahead + b);
    }
    const float* const* sc = w.scale != nullptr ? static_cast<const float* const*>(scales) : nullptr;
    if (rows == 1) {
      float d[4];
      simd::run_on<DotFour>(isa, static_cast<const T* const*>(ptrs), sc, xs, in, d);
      for (int64_t k = 0; k < n; ++k) ys[o + k] = bias != nullptr ? d[k] + bias[o + k] : d[k];
      continue;
    }
    // Four rows of x at a time (the last group repeats its first row where fewer are left).
    for (int64_t r0 = 0; r0 < rows; r0 += 4) {
      const int64_t m = std::min<int64_t>(4, rows - r0);
      const float* xr[4];
      for (int64_t r = 0; r < 4; ++r) xr[r] = xs + (r0 + (r < m ? r : 0)) * in;
      float d[16];
      simd::run_on<DotTile>(isa, static_cast<const T* const*>(ptrs), sc, static_cast<const float* const*>(xr), in, d);
      for (int64_t k = 0; k < n; ++k) {
        for (int64_t r = 0; r < m; ++r) {
          ys[(r0 + r) * ldy + o + k] = bias != nullptr ? d[k * 4 + r] + bias[o + k] : d[k * 4 + r];
        }
      }
    }
  }
}

// One row of weights quantized per group of kInt8Group: scale[g] = max |w| over the
// group / 127, q = round(w / divisor) to nearest (ties to even), divisor the scale or 1
// where it is 0, clamped to [-127, 127]: the float32 divisions and roundings of
// PyTorch's own ops for the scheme (tests/golden/weights.txt). false where the row
// holds a NaN or an infinity (w * 0 is NaN then).
struct QuantizeRow {
  static constexpr Isa kWidest = Isa::Avx512;
  template <class S>
  static bool run(const float* w, int64_t in, int8_t* q, float* scale) {
    using V = typename S::V;
    float rounded[kInt8Group];
    V bad = S::zero();
    float bad_tail = 0.0f;
    for (int64_t g0 = 0, g = 0; g0 < in; g0 += kInt8Group, ++g) {
      const int64_t n = std::min(kInt8Group, in - g0);
      const float* wg = w + g0;
      V m = S::zero();
      int64_t i = 0;
      for (; i + S::W <= n; i += S::W) {
        const V v = S::load(wg + i);
        bad = S::add(bad, S::mul(v, S::zero()));
        m = S::max(m, S::abs(v));
      }
      float amax = S::reduce_max(m);
      for (; i < n; ++i) {
        bad_tail += wg[i] * 0.0f;
        amax = std::max(amax, std::fabs(wg[i]));
      }
      const float s = amax / 127.0f;
      const float divisor = s > 0.0f ? s : 1.0f;
      const V dv = S::set1(divisor);
      i = 0;
      for (; i + S::W <= n; i += S::W) S::store(rounded + i, S::round(S::div(S::load(wg + i), dv)));
      for (; i < n; ++i) rounded[i] = simd::Scalar::round(wg[i] / divisor);
      // A NaN (from a NaN or infinity, refused below) stored as 0: converting it is undefined.
      for (i = 0; i < n; ++i) {
        q[g0 + i] = rounded[i] == rounded[i] ? static_cast<int8_t>(std::clamp(rounded[i], -127.0f, 127.0f)) : 0;
      }
      scale[g] = s;
    }
    const float sum = S::reduce_add(bad) + bad_tail;
    return sum == sum;  // NaN from a NaN or infinity
  }
};

bool dense_cpu(const at::Tensor& t, int64_t dim) {
  return t.is_cpu() && t.layout() == at::kStrided && !t.is_nested() && t.dim() == dim && t.is_contiguous();
}

// One weight matrix of a call and where its outputs go: y[m * ldy + o]; int4 weights
// read x's group sums too (sx [rows, in / 32], int4::group_sums).
struct Part {
  Weights w;
  const float* bias;
  float* y;
  int64_t ldy;
  const float* sx = nullptr;
  const int8_t* qx = nullptr;     // int4 with int8 products: x quantized (int4::quantize_inputs)
  const float* qscale = nullptr;  // [rows, in / 32, 2]: (s, sum of x) pairs
};

// x [rows, in] contiguous, at most kQuantizedMatvecRows rows: the matrix-vector
// kernels over outputs [begin, end) of one part, on the calling thread.
void matvec_range(const float* xs, int64_t rows, const Part& p, int64_t begin, int64_t end) {
  const Weights& w = p.w;
  if (w.int4) {
    if (p.qx != nullptr) {
      int4::dot_rows_products(best_isa(), static_cast<const uint8_t*>(w.q), w.dm, w.in, begin, end, p.qx, p.qscale,
                              rows, p.bias, p.y, p.ldy);
    } else {
      int4::dot_rows(static_cast<const uint8_t*>(w.q), w.dm, w.in, begin, end, xs, p.sx, rows, p.bias, p.y, p.ldy);
    }
    return;
  }
  if (!w.int8 && rows == 1) {
    // One row of x over bfloat16 weights, per instruction set (see DotRows).
    const Isa isa = best_isa();
    const auto* q = static_cast<const uint16_t*>(w.q);
    if (isa != Isa::Scalar) {
      simd::run_on<DotRows>(isa, q + begin * w.in, xs, w.in, end - begin, p.y + begin);  // four streams
    } else {
      const int64_t bytes = w.in * static_cast<int64_t>(sizeof(uint16_t));
      const char* stop = reinterpret_cast<const char*>(q + end * w.in);
      for (int64_t o = begin; o < end; ++o) {
        // kOneRowAhead bytes down the stream on their way while this row is summed.
        const char* ahead = reinterpret_cast<const char*>(q + o * w.in) + kOneRowAhead;
        if (ahead + bytes <= stop) {
          for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(ahead + b);
        }
        DotRows::rows<simd::Scalar, 1>(q + o * w.in, xs, w.in, w.in, p.y + o, 1);
      }
    }
    if (p.bias != nullptr) {
      for (int64_t o = begin; o < end; ++o) p.y[o] += p.bias[o];
    }
    return;
  }
  if (w.int8) {
    fused_rows<int8_t>(w, begin, end, xs, rows, p.bias, p.y, p.ldy);
  } else {
    fused_rows<uint16_t>(w, begin, end, xs, rows, p.bias, p.y, p.ldy);
  }
}

// Every part's outputs split over the threads at once (one parallel region).
void matvec(const float* xs, int64_t rows, const std::vector<Part>& parts) {
  int64_t total = 0;
  for (const auto& p : parts) total += p.w.out;
  const int64_t grain = std::max<int64_t>(16, 16384 / std::max<int64_t>(parts[0].w.in, 1));
  parallel_for_unless_stalled(total, grain, [&](int64_t begin, int64_t end) {
    int64_t first = 0;
    for (const auto& p : parts) {
      const int64_t b = std::max(begin, first), e = std::min(end, first + p.w.out);
      if (b < e) matvec_range(xs, rows, p, b - first, e - first);
      first += p.w.out;
    }
  });
}

// x [rows, in] contiguous, many rows: tiles of output features dequantized, then a GEMM.
void tiled(const at::Tensor& x, const Weights& w, const at::Tensor& bias, at::Tensor& y) {
  const int64_t in = w.in, out = w.out;
  // A tile of about 1 MB of floats: it stays in the cache between its widening and the GEMM.
  const int64_t tile = std::clamp<int64_t>((int64_t{1} << 18) / std::max<int64_t>(in, 1), 16, out);
  at::Tensor buffer = at::empty({tile, in}, x.options());
  for (int64_t o0 = 0; o0 < out; o0 += tile) {
    const int64_t n = std::min(tile, out - o0);
    at::Tensor part_w = buffer.narrow(0, 0, n);
    float* wp = part_w.mutable_data_ptr<float>();
    at::parallel_for(0, n, std::max<int64_t>(1, 4096 / std::max<int64_t>(in, 1)),
                     [&](int64_t b, int64_t e) { dequantize_range(w, o0 + b, o0 + e, wp + b * in); });
    const at::Tensor b = bias.defined() ? bias.narrow(0, o0, n) : at::Tensor();
    const at::Tensor part = onednn_linear_applies(x, part_w, b)
                                ? onednn_linear(x, part_w, b)
                                : at::linear(x, part_w, b.defined() ? std::optional<at::Tensor>(b) : std::nullopt);
    y.narrow(1, o0, n).copy_(part);
  }
}

}  // namespace

int64_t int8_groups(int64_t in) { return (in + kInt8Group - 1) / kInt8Group; }

bool int8_products_auto() {
  // Where the int8 products run ahead of the float products (int8 / float time, best of
  // 5 interleaved, 2 threads, weights [2048, 2048], [8192, 2048] and [2048, 8192] of a
  // 1B model, 256 MB of them cycled so that they come from memory):
  // - AVX2 (vpmaddubsw), AMD EPYC Zen 3: 1 row 0.38-0.61, 2 rows 0.49-0.59, 4 rows
  //   0.75-0.88, 8 rows 0.65-0.76, 16 rows 0.58-0.76, 64 rows 0.21-0.40, 512 rows
  //   0.41-0.46 (36-39 GMAC/s against the widened tiles' 16);
  // - AVX-512 VNNI (vpdpbusd), AMD EPYC Zen 5: the default at every number of rows
  //   since the kernel came (four times a float32 FMA's products an instruction; the
  //   weights page, apps/bench/results/weights.md, measures it there), not re-measured
  //   against the float products on an AVX2-only machine;
  // - the portable loop (no AVX2): never.
  // So every number of rows, where the CPU has either instruction set: a row's outputs
  // are then the same bits in a prefill, a decoding step and any batch.
  return best_isa() >= Isa::Avx2;  // a vector int8 kernel (int8_products.h)
}

namespace {

// Whether int4 weights take the int8 products (quantized_linear.h).
bool int4_products_apply(Int8Products products) {
  return products == Int8Products::Int8 || (products == Int8Products::Auto && int8_products_auto());
}

}  // namespace

std::pair<at::Tensor, at::Tensor> quantize_int8_groups(const at::Tensor& weight_in) {
  TORCH_CHECK(weight_in.dim() == 2 && weight_in.scalar_type() == at::kFloat,
              "quantize_int8_groups: expected a float32 weight [out, in], got ", weight_in.sizes(), " of ",
              weight_in.scalar_type());
  const at::Tensor weight = weight_in.contiguous();
  const int64_t out = weight.size(0), in = weight.size(1), groups = int8_groups(in);
  at::Tensor q = at::empty({out, in}, weight.options().dtype(at::kChar));
  at::Tensor scale = at::empty({out, groups}, weight.options());
  if (out == 0 || in == 0) return {q, scale};
  const float* w = weight.const_data_ptr<float>();
  int8_t* qp = q.mutable_data_ptr<int8_t>();
  float* sp = scale.mutable_data_ptr<float>();
  // One pass over each row, its groups on the stack: no temporaries the size of the
  // weight (a 1B model quantized at load keeps only its int8 weights and one layer).
  std::atomic<int64_t> first_bad{out};
  const Isa isa = best_isa();
  at::parallel_for(0, out, std::max<int64_t>(1, 65536 / in), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      if (!simd::run_on<QuantizeRow>(isa, w + r * in, in, qp + r * in, sp + r * groups)) {
        int64_t seen = first_bad.load();
        while (r < seen && !first_bad.compare_exchange_weak(seen, r)) {}
      }
    }
  });
  TORCH_CHECK(first_bad.load() == out, "quantize_int8_groups: expected finite weights, got a NaN or infinity in row ",
              first_bad.load());
  return {q, scale};
}

int64_t first_unproducible_scale(const at::Tensor& data_in, const at::Tensor& scale_in) {
  TORCH_CHECK(data_in.scalar_type() == at::kChar && data_in.is_cpu() && data_in.dim() == 2 &&
                  scale_in.scalar_type() == at::kFloat && scale_in.is_cpu() && scale_in.dim() == 2 &&
                  scale_in.size(0) == data_in.size(0) && scale_in.size(1) == int8_groups(data_in.size(1)),
              "first_unproducible_scale: expected int8 [out, in] and float32 [out, groups] CPU tensors, got ",
              data_in.sizes(), " ", data_in.scalar_type(), " and ", scale_in.sizes(), " ", scale_in.scalar_type());
  const at::Tensor data = data_in.contiguous(), scale = scale_in.contiguous();
  const int64_t out = data.size(0), in = data.size(1), groups = scale.size(1);
  const int8_t* q = data.const_data_ptr<int8_t>();
  const float* s = scale.const_data_ptr<float>();
  // The largest scale quantize_int8_groups makes: the largest float32 over 127.
  const float largest = std::numeric_limits<float>::max() / 127.0f;
  // A scale s > 0 is a group's largest |weight| / 127, so that weight's value is +-127;
  // below the smallest normal float the division rounds too coarsely to say.
  const float normal = std::numeric_limits<float>::min();
  const int64_t none = out * groups;
  std::atomic<int64_t> first_bad{none};
  at::parallel_for(0, out, std::max<int64_t>(1, 65536 / std::max<int64_t>(groups, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end && r * groups < first_bad.load(std::memory_order_relaxed); ++r) {
      for (int64_t g = 0; g < groups; ++g) {
        const float v = s[r * groups + g];
        // NaN fails both comparisons; a zero scale only over a group of zeros, any
        // other only over a group that reaches 127.
        bool good = v >= 0.0f && v <= largest;
        if (good && (v == 0.0f || v >= normal)) {
          const int64_t lo = g * kInt8Group, hi = std::min(in, lo + kInt8Group);
          int most = 0;
          for (int64_t i = lo; i < hi; ++i) most = std::max(most, std::abs(static_cast<int>(q[r * in + i])));
          good = v == 0.0f ? most == 0 : most == 127;
        }
        if (!good) {
          int64_t seen = first_bad.load();
          const int64_t at = r * groups + g;
          while (at < seen && !first_bad.compare_exchange_weak(seen, at)) {}
          break;
        }
      }
    }
  });
  return first_bad.load() == none ? -1 : first_bad.load();
}

bool quantized_linear_applies(const at::Tensor& x, const at::Tensor& data, const at::Tensor& scale,
                              const at::Tensor& bias) {
  if (!data.defined() || !dense_cpu(data, 2) || data.numel() == 0) return false;
  if (data.scalar_type() == at::kByte) {
    if (!int4_weights(data, scale)) return false;
  } else if (data.scalar_type() == at::kChar) {
    if (!scale.defined() || !dense_cpu(scale, 2) || scale.scalar_type() != at::kFloat ||
        scale.size(0) != data.size(0) || scale.size(1) != int8_groups(data.size(1))) {
      return false;
    }
  } else if (data.scalar_type() != at::kBFloat16 || scale.defined()) {
    return false;
  }
  if (bias.defined() &&
      (!dense_cpu(bias, 1) || bias.scalar_type() != at::kFloat || bias.size(0) != data.size(0) || needs_grad(bias))) {
    return false;
  }
  return x.defined() && x.is_cpu() && x.scalar_type() == at::kFloat && x.layout() == at::kStrided && !x.is_nested() &&
         x.dim() >= 1 && x.size(-1) == inputs_of(data) && !needs_grad(x);
}

bool quantized_linear_applies(const at::Tensor& x, at::ArrayRef<QuantizedWeight> parts) {
  if (parts.empty()) return false;
  for (const auto& p : parts) {
    if (!quantized_linear_applies(x, p.data, p.scale, p.bias) || p.data.scalar_type() != parts[0].data.scalar_type()) {
      return false;
    }
  }
  return true;
}

at::Tensor quantized_linear(const at::Tensor& x_in, const at::Tensor& data, const at::Tensor& scale,
                            const at::Tensor& bias, Int8Products products) {
  const QuantizedWeight part{data, scale, bias};
  return quantized_linear(x_in, at::ArrayRef<QuantizedWeight>(part), products);
}

at::Tensor quantized_linear(const at::Tensor& x_in, at::ArrayRef<QuantizedWeight> parts, Int8Products products) {
  TORCH_CHECK(quantized_linear_applies(x_in, parts),
              "quantized_linear: expected float32 CPU x [..., in] with no gradient, int8 [out, in] data with "
              "float32 scales [out, groups of 64] (int4: uint8 [out, in / 2] with float16 [out, in / 32, 2]; or "
              "bfloat16 data, no scales) and a float32 bias [out] or none, every part of one dtype and one in; got x ",
              x_in.sizes(), " of ", x_in.scalar_type(), " on ", x_in.device(), " and ", parts.size(),
              " parts, the first ", parts.empty() ? at::IntArrayRef{} : parts[0].data.sizes(), " of ",
              parts.empty() ? at::kChar : parts[0].data.scalar_type());
  const int64_t in = inputs_of(parts[0].data);
  const bool int8 = parts[0].data.scalar_type() == at::kChar;
  const bool int4 = parts[0].data.scalar_type() == at::kByte;
  int64_t total = 0;
  for (const auto& p : parts) total += p.data.size(0);
  std::vector<int64_t> shape = x_in.sizes().vec();
  shape.back() = total;
  const int64_t rows = in == 0 ? 0 : x_in.numel() / in;
  const at::Tensor x = x_in.reshape({rows, in}).contiguous();
  if (rows > 0 && int8 &&
      (products == Int8Products::Int8 || (products == Int8Products::Auto && int8_products_auto()))) {
    return int8_products_linear(x, parts, best_isa()).reshape(shape);
  }
  at::Tensor y = at::empty({rows, total}, x.options());
  if (rows == 0) return y.reshape(shape);
  if (rows <= kQuantizedMatvecRows) {
    std::vector<Part> calls;
    float* y0 = y.mutable_data_ptr<float>();
    // int4: x's group sums, and with int8 products x quantized per group of 32, once
    // for every part.
    const int64_t groups = int4 ? in / kInt4Group : 0;
    const bool int4_products = int4 && int4_products_apply(products);
    std::vector<float> sx(int4 && !int4_products ? static_cast<size_t>(rows * groups) : 0);
    std::vector<float> qscale(int4_products ? static_cast<size_t>(2 * rows * groups) : 0);
    std::vector<int8_t> qx(int4_products ? static_cast<size_t>(rows * in) : 0);
    if (int4 && !int4_products) int4::group_sums(x.const_data_ptr<float>(), rows, in, sx.data());
    if (int4_products) int4::quantize_inputs(x.const_data_ptr<float>(), rows, in, qx.data(), qscale.data());
    int64_t col = 0;
    for (const auto& p : parts) {
      calls.push_back({weights_of(p.data, p.scale), p.bias.defined() ? p.bias.const_data_ptr<float>() : nullptr,
                       y0 + col, total, int4 && !int4_products ? sx.data() : nullptr,
                       int4_products ? qx.data() : nullptr, int4_products ? qscale.data() : nullptr});
      col += p.data.size(0);
    }
    matvec(x.const_data_ptr<float>(), rows, calls);
  } else if (int4 && int4_products_apply(products) && int4::products_tiles_apply(best_isa())) {
    // A prefill of int4 weights with the int8 products: x quantized once for every part.
    const int64_t groups = in / kInt4Group;
    std::vector<float> qscale(static_cast<size_t>(2 * rows * groups));
    std::vector<int8_t> qx(static_cast<size_t>(rows * in));
    int4::quantize_inputs(x.const_data_ptr<float>(), rows, in, qx.data(), qscale.data());
    float* y0 = y.mutable_data_ptr<float>();
    int64_t col = 0;
    for (const auto& p : parts) {
      const Weights w = weights_of(p.data, p.scale);
      int4::products_tiles(best_isa(), static_cast<const uint8_t*>(w.q), w.dm, w.out, in, qx.data(), qscale.data(),
                           rows, p.bias.defined() ? p.bias.const_data_ptr<float>() : nullptr, y0 + col, total);
      col += p.data.size(0);
    }
  } else {
    int64_t col = 0;
    for (const auto& p : parts) {
      at::Tensor slice = y.narrow(1, col, p.data.size(0));
      tiled(x, weights_of(p.data, p.scale), p.bias, slice);
      col += p.data.size(0);
    }
  }
  return y.reshape(shape);
}

at::Tensor dequantized_rows(const at::Tensor& data, const at::Tensor& scale, const at::Tensor& ids) {
  TORCH_CHECK(ids.scalar_type() == at::kLong, "dequantized_rows: expected int64 ids, got ", ids.scalar_type());
  TORCH_CHECK(data.dim() == 2 && (data.scalar_type() == at::kChar || data.scalar_type() == at::kBFloat16 ||
                                  (data.scalar_type() == at::kByte && int4_weights(data.contiguous(), scale))),
              "dequantized_rows: expected int8, int4 or bfloat16 data [rows, in] (with its scales), got ", data.sizes(),
              " of ", data.scalar_type());
  const at::Tensor flat = ids.reshape({-1}).contiguous();
  const int64_t n = flat.numel(), rows = data.size(0);
  const int64_t* id = flat.const_data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(id[i] >= 0 && id[i] < rows, "dequantized_rows: id ", id[i], " is outside the table's ", rows, " rows");
  }
  const Weights w = weights_of(data.contiguous(), scale);
  at::Tensor out = at::empty({n, w.in}, data.options().dtype(at::kFloat));
  float* o = out.mutable_data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) dequantize_range(w, id[i], id[i] + 1, o + i * w.in);
  std::vector<int64_t> shape = ids.sizes().vec();
  shape.push_back(w.in);
  return out.reshape(shape);
}

}  // namespace torchattn::kernels::cpu

TORCHATTN_SIMD_KERNELS_END

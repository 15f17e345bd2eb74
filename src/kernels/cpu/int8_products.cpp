#include "kernels/cpu/int8_products.h"

#include <torchattn/detail/kernels/cpu/cpu_features.h>
#include "kernels/cpu/int8_rows.h"
#include "kernels/cpu/quantized_linear.h"
#include <torchattn/detail/kernels/cpu/simd.h>
#include "kernels/cpu/stall_aware.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace torchattn::kernels::cpu {

namespace {

using int8::kGroup;
using int8::kRowTile;
using int8::QuantizedRows;

// The kernels, narrowest first (int8_products.h: the one each Isa runs).
enum class Int8Kernel : int8_t { Portable, Avx2, Vnni };

Int8Kernel kernel_of(Isa isa) {
  if (isa >= Isa::Avx512Vnni) return Int8Kernel::Vnni;
  return isa >= Isa::Avx2 ? Int8Kernel::Avx2 : Int8Kernel::Portable;
}

TORCHATTN_SIMD_KERNELS_BEGIN

// One row of x quantized by groups of kGroup (the last may be shorter): each group's
// scale s = max |x| / 127 (NaN where the group holds a NaN or an infinity, its bytes
// then 128), and its inputs as round(x / s) (ties to even; 0 where s is 0), clamped to
// [-127, 127], plus 128: the same float32 steps on every vector type, so the same bytes.
struct QuantizeRow {
  static constexpr Isa kWidest = Isa::Avx512;
  template <class S>
  static void run(const float* x, int64_t in, int64_t groups, uint8_t* out, float* scale) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t g0 = g * kGroup;
      if (in - g0 >= kGroup) {
        scale[g] = group<S, kGroup>(x + g0, kGroup, out + g0);  // whole: its vectors held in registers
      } else {
        scale[g] = group<S, 0>(x + g0, in - g0, out + g0);
      }
    }
  }
  // One group of n inputs (N: n known at compile time, or 0); returns its scale.
  template <class S, int64_t N>
  static float group(const float* x, int64_t n_in, uint8_t* out) {
    using V = typename S::V;
    constexpr int W = S::W;
    constexpr int64_t kMax = (kGroup + W - 1) / W;
    const int64_t n = N > 0 ? N : n_in, vectors = (n + W - 1) / W;
    const auto lanes = [=](int64_t v) { return static_cast<int>(std::min<int64_t>(W, n - v * W)); };
    V xs[kMax];
    V amax = S::zero(), bad = S::zero();
    for (int64_t v = 0; v < vectors; ++v) {
      xs[v] = N > 0 ? S::load(x + v * W) : S::load(x + v * W, lanes(v));  // zeros past n
      const V a = S::abs(xs[v]);
      bad = S::add(bad, S::mul(a, S::zero()));  // NaN where an input is NaN or infinite
      amax = S::max(amax, a);
    }
    const float flag = S::reduce_add(bad);
    const float s = flag != flag ? std::numeric_limits<float>::quiet_NaN() : S::reduce_max(amax) / 127.0f;
    if (!(s > 0.0f)) {
      std::memset(out, 128, static_cast<size_t>(n));
      return s;
    }
    const V sv = S::set1(s), lo = S::set1(-127.0f), hi = S::set1(127.0f), bias = S::set1(128.0f);
    for (int64_t v = 0; v < vectors; ++v) {
      const V q = S::min(S::max(S::round(S::div(xs[v], sv)), lo), hi);
      S::narrow(out + v * W, S::add(q, bias), N > 0 ? W : lanes(v));
    }
    return s;
  }
};

TORCHATTN_SIMD_KERNELS_END

QuantizedRows quantize_rows(const float* x, int64_t rows, int64_t in, Int8Kernel kernel) {
  QuantizedRows r;
  r.groups = int8_groups(in);
  r.padded_in = r.groups * kGroup;
  r.rows = (rows + kRowTile - 1) / kRowTile * kRowTile;
  r.bytes.assign(static_cast<size_t>(r.rows * r.padded_in), 128);
  r.scale.assign(static_cast<size_t>(r.rows * r.groups), 0.0f);
  // The instructions of the kernel's own set (quantizing needs AVX-512F of VNNI's).
  const Isa isa = kernel == Int8Kernel::Vnni ? Isa::Avx512 : kernel == Int8Kernel::Avx2 ? Isa::Avx2 : Isa::Scalar;
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(in, 1)), [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      simd::run_on<QuantizeRow>(isa, x + m * in, in, r.groups, r.bytes.data() + m * r.padded_in,
                                r.scale.data() + m * r.groups);
    }
  });
  return r;
}

}  // namespace

const char* int8_kernel_name(Isa isa) {
  switch (kernel_of(isa)) {
    case Int8Kernel::Vnni:
      return "vnni";
    case Int8Kernel::Avx2:
      return "avx2";
    case Int8Kernel::Portable:
      break;
  }
  return "portable";
}

at::Tensor int8_products_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale,
                                const at::Tensor& bias, Isa isa) {
  const QuantizedWeight part{q, scale, bias};
  return int8_products_linear(x, at::ArrayRef<QuantizedWeight>(part), isa);
}

at::Tensor int8_products_linear(const at::Tensor& x, at::ArrayRef<QuantizedWeight> parts, Isa isa) {
  check_isa_at_most(isa, best_isa(), "int8_products_linear");
  const Int8Kernel kernel = kernel_of(isa);
  const int64_t rows = x.size(0), in = x.size(1);
  int64_t total = 0;
  for (const auto& p : parts) total += p.data.size(0);
  at::Tensor y = at::empty({rows, total}, x.options());
  if (rows == 0 || total == 0) return y;
  QuantizedRows xr = quantize_rows(x.const_data_ptr<float>(), rows, in, kernel);
  int8::prepare(isa, xr);
  std::vector<int8::Int8Call> calls;
  float* y0 = y.mutable_data_ptr<float>();
  int64_t col = 0;
  for (const auto& p : parts) {
    calls.push_back({p.data.const_data_ptr<int8_t>(), p.scale.const_data_ptr<float>(), in, p.data.size(0),
                     p.bias.defined() ? p.bias.const_data_ptr<float>() : nullptr, y0 + col, total});
    col += p.data.size(0);
  }
  if (rows > int8::kFewRows) {
    for (const auto& c : calls) int8::kernel_panels(isa, xr, rows, c);
    return y;
  }
  // Every part's outputs [0, total) split over the threads at once.
  const int64_t grain = std::max<int64_t>(16, 16384 / std::max<int64_t>(in, 1));
  parallel_for_unless_stalled(total, grain, [&](int64_t begin, int64_t end) {
    int64_t first = 0;
    for (const auto& c : calls) {
      const int64_t b = std::max(begin, first), e = std::min(end, first + c.out);
      if (b < e) int8::kernel_rows(isa, xr, rows, c, b - first, e - first);
      first += c.out;
    }
  });
  return y;
}

}  // namespace torchattn::kernels::cpu

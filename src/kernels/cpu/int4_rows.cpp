#include "kernels/cpu/int4_rows.h"

#include <torchattn/kernels/cpu/simd.h>

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>

TORCHATTN_SIMD_KERNELS_BEGIN

namespace torchattn::kernels::cpu {

// The helpers in int4's own namespace: a unity build puts this file beside the int8
// kernels' (whose names they share).
namespace int4 {
namespace {

constexpr int64_t kGroup = kInt4Group;
constexpr int64_t kGroupBytes = kGroup / 2;
// Groups whose (d, m) are widened to floats at once, per weight row (on the stack).
constexpr int64_t kChunk = 64;

uint16_t half_bits(float v) { return c10::Half(v).x; }

// out[0, n) = the float16 values at p (their bits) as floats.
template <class S>
void widen_halves(const uint16_t* p, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + S::W <= n; i += S::W) S::store(out + i, S::widen_halves(p + i));
  for (; i < n; ++i) out[i] = simd::Scalar::widen_halves(p + i);
}

// One row's groups: data bytes (16 a group) and (d, m) pairs.
struct Dequantize {
  static constexpr Isa kWidest = Isa::Avx512;
  template <class S>
  static void run(const uint8_t* q, const uint16_t* dm, int64_t groups, float* out) {
    alignas(64) float f[2 * kChunk];
    for (int64_t g0 = 0; g0 < groups; g0 += kChunk) {
      const int64_t n = std::min(kChunk, groups - g0);
      widen_halves<S>(dm + 2 * g0, 2 * n, f);
      for (int64_t g = 0; g < n; ++g) {
        const uint8_t* b = q + (g0 + g) * kGroupBytes;
        float* o = out + (g0 + g) * kGroup;
        const typename S::V d = S::set1(f[2 * g]), m = S::set1(f[2 * g + 1]);
        for (int64_t j = 0; j < kGroupBytes; j += S::W) {
          S::store(o + j, S::fma(S::widen_low_nibbles(b + j), d, m));
          S::store(o + kGroupBytes + j, S::fma(S::widen_high_nibbles(b + j), d, m));
        }
      }
    }
  }
};

// out[k] = the int4 product of weight rows q[k], dm[k] (k < 4) with one row of x (sx
// its group sums): per group, two vector accumulators' worth of products a row, folded
// into the row's total by the group's d; m times sx summed apart.
struct DotFour {
  static constexpr Isa kWidest = Isa::Avx512;
  template <class S>
  static void run(const uint8_t* const* q, const uint16_t* const* dm, const float* x, const float* sx, int64_t groups,
                  float* out) {
    using V = typename S::V;
    V t[4] = {S::zero(), S::zero(), S::zero(), S::zero()};
    float offsets[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    alignas(64) float f[4][2 * kChunk];
    for (int64_t g0 = 0; g0 < groups; g0 += kChunk) {
      const int64_t n = std::min(kChunk, groups - g0);
      for (int k = 0; k < 4; ++k) widen_halves<S>(dm[k] + 2 * g0, 2 * n, f[k]);
      for (int64_t g = 0; g < n; ++g) {
        const float* xg = x + (g0 + g) * kGroup;
        const int64_t at = (g0 + g) * kGroupBytes;
        V a[4] = {S::zero(), S::zero(), S::zero(), S::zero()};
        for (int64_t j = 0; j < kGroupBytes; j += S::W) {
          const V lo = S::load(xg + j), hi = S::load(xg + kGroupBytes + j);
          for (int k = 0; k < 4; ++k) {
            a[k] = S::fma(S::widen_low_nibbles(q[k] + at + j), lo, a[k]);
            a[k] = S::fma(S::widen_high_nibbles(q[k] + at + j), hi, a[k]);
          }
        }
        const float s = sx[g0 + g];
        for (int k = 0; k < 4; ++k) {
          t[k] = S::fma(a[k], S::set1(f[k][2 * g]), t[k]);
          offsets[k] = std::fma(f[k][2 * g + 1], s, offsets[k]);
        }
      }
    }
    for (int k = 0; k < 4; ++k) out[k] = S::reduce_add(t[k]) + offsets[k];
  }
};

// One row quantized as int4_rows.h says; false where it holds a NaN or an infinity, or
// a group float16 cannot hold.
bool quantize_row(const float* w, int64_t in, uint8_t* q, uint16_t* dm) {
  uint8_t values[kGroup];
  for (int64_t g0 = 0, g = 0; g0 < in; g0 += kGroup, ++g) {
    const float* wg = w + g0;
    float lo = wg[0], hi = wg[0];
    bool finite = true;
    for (int64_t i = 0; i < kGroup; ++i) {
      finite = finite && std::isfinite(wg[i]);
      lo = std::min(lo, wg[i]);
      hi = std::max(hi, wg[i]);
    }
    if (!finite) return false;
    const uint16_t d_bits = half_bits((hi - lo) / 15.0f), m_bits = half_bits(lo);
    const float d = simd::Scalar::widen_halves(&d_bits), m = simd::Scalar::widen_halves(&m_bits);
    if (!std::isfinite(d) || !std::isfinite(m)) return false;
    for (int64_t i = 0; i < kGroup; ++i) {
      const float r = d > 0.0f ? std::nearbyint((wg[i] - m) / d) : 0.0f;
      values[i] = static_cast<uint8_t>(std::clamp(r, 0.0f, 15.0f));
    }
    for (int64_t j = 0; j < kGroupBytes; ++j) {
      q[g * kGroupBytes + j] = static_cast<uint8_t>(values[j] | (values[j + kGroupBytes] << 4));
    }
    dm[2 * g] = d_bits;
    dm[2 * g + 1] = m_bits;
  }
  return true;
}

bool dense_cpu(const at::Tensor& t, int64_t dim) {
  return t.defined() && t.is_cpu() && t.layout() == at::kStrided && !t.is_nested() && t.dim() == dim &&
         t.is_contiguous();
}

}  // namespace
}  // namespace int4

std::pair<at::Tensor, at::Tensor> quantize_int4_groups(const at::Tensor& weight_in) {
  TORCH_CHECK(weight_in.dim() == 2 && weight_in.scalar_type() == at::kFloat,
              "quantize_int4_groups: expected a float32 weight [out, in], got ", weight_in.sizes(), " of ",
              weight_in.scalar_type());
  TORCH_CHECK(weight_in.size(1) % kInt4Group == 0, "int4 weights take layers whose inputs are a multiple of ",
              kInt4Group, " (groups of ", kInt4Group, " share a scale), got in_features ", weight_in.size(1),
              " (int8 takes any number)");
  const at::Tensor weight = weight_in.contiguous();
  const int64_t out = weight.size(0), in = weight.size(1), groups = in / kInt4Group;
  at::Tensor data = at::empty({out, in / 2}, weight.options().dtype(at::kByte));
  at::Tensor scale = at::empty({out, groups, 2}, weight.options().dtype(at::kHalf));
  if (out == 0 || in == 0) return {data, scale};
  const float* w = weight.const_data_ptr<float>();
  auto* qp = data.mutable_data_ptr<uint8_t>();
  auto* sp = reinterpret_cast<uint16_t*>(scale.mutable_data_ptr<at::Half>());
  std::atomic<int64_t> first_bad{out};
  at::parallel_for(0, out, std::max<int64_t>(1, 65536 / in), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      if (!int4::quantize_row(w + r * in, in, qp + r * (in / 2), sp + r * 2 * groups)) {
        int64_t seen = first_bad.load();
        while (r < seen && !first_bad.compare_exchange_weak(seen, r)) {}
      }
    }
  });
  TORCH_CHECK(first_bad.load() == out, "quantize_int4_groups: expected finite weights whose groups' minimum and ",
              "range / 15 are within float16's 65504, got row ", first_bad.load(),
              " (a NaN or an infinity, or a group past that)");
  return {data, scale};
}

bool int4_weights(const at::Tensor& data, const at::Tensor& scale) {
  return int4::dense_cpu(data, 2) && data.scalar_type() == at::kByte && int4::dense_cpu(scale, 3) &&
         scale.scalar_type() == at::kHalf && scale.size(0) == data.size(0) && (2 * data.size(1)) % kInt4Group == 0 &&
         scale.size(1) == 2 * data.size(1) / kInt4Group && scale.size(2) == 2;
}

int64_t first_non_finite_int4_scale(const at::Tensor& scale_in) {
  TORCH_CHECK(scale_in.scalar_type() == at::kHalf && scale_in.dim() == 3 && scale_in.size(2) == 2,
              "first_non_finite_int4_scale: expected float16 [out, groups, 2], got ", scale_in.sizes(), " of ",
              scale_in.scalar_type());
  const at::Tensor scale = scale_in.contiguous();
  const auto* p = reinterpret_cast<const uint16_t*>(scale.const_data_ptr<at::Half>());
  const int64_t pairs = scale.numel() / 2;
  for (int64_t i = 0; i < pairs; ++i) {
    // Exponent bits all ones: an infinity or a NaN.
    if ((p[2 * i] & 0x7c00u) == 0x7c00u || (p[2 * i + 1] & 0x7c00u) == 0x7c00u) return i;
  }
  return -1;
}

namespace int4 {

void dequantize_rows(const uint8_t* q, const uint16_t* dm, int64_t in, int64_t begin, int64_t end, float* out) {
  const Isa isa = best_isa();
  const int64_t groups = in / kGroup;
  for (int64_t o = begin; o < end; ++o) {
    simd::run_on<Dequantize>(isa, q + o * (in / 2), dm + o * 2 * groups, groups, out + (o - begin) * in);
  }
}

void dot_rows(const uint8_t* q, const uint16_t* dm, int64_t in, int64_t begin, int64_t end, const float* xs,
              const float* sx, int64_t rows, const float* bias, float* y, int64_t ldy) {
  const Isa isa = best_isa();
  const int64_t groups = in / kGroup, row_bytes = in / 2;
  for (int64_t o = begin; o < end; o += 4) {
    const int64_t n = std::min<int64_t>(4, end - o);
    const uint8_t* qs[4];
    const uint16_t* dms[4];
    for (int64_t k = 0; k < 4; ++k) {
      const int64_t row = o + (k < n ? k : 0);  // fewer than four left: the first again
      qs[k] = q + row * row_bytes;
      dms[k] = dm + row * 2 * groups;
    }
    // The rows after next on their way from memory while these are summed.
    if (o + 12 <= end) {
      const char* ahead = reinterpret_cast<const char*>(q + (o + 8) * row_bytes);
      for (int64_t b = 0; b < 4 * row_bytes; b += 64) __builtin_prefetch(ahead + b);
      const char* ahead_dm = reinterpret_cast<const char*>(dm + (o + 8) * 2 * groups);
      for (int64_t b = 0; b < 4 * 4 * groups; b += 64) __builtin_prefetch(ahead_dm + b);
    }
    for (int64_t r = 0; r < rows; ++r) {
      float d[4];
      simd::run_on<DotFour>(isa, static_cast<const uint8_t* const*>(qs), static_cast<const uint16_t* const*>(dms),
                            xs + r * in, sx + r * groups, groups, d);
      for (int64_t k = 0; k < n; ++k) y[r * ldy + o + k] = bias != nullptr ? d[k] + bias[o + k] : d[k];
    }
  }
}

void group_sums(const float* xs, int64_t rows, int64_t in, float* sx) {
  const int64_t groups = in / kGroup;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* x = xs + r * in + g * kGroup;
      float s = 0.0f;
      for (int64_t i = 0; i < kGroup; ++i) s += x[i];
      sx[r * groups + g] = s;
    }
  }
}

}  // namespace int4

}  // namespace torchattn::kernels::cpu

TORCHATTN_SIMD_KERNELS_END

#include "kernels/cpu/int8_products.h"

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/int8_rows.h"
#include "kernels/cpu/quantized_linear.h"
#include "kernels/cpu/stall_aware.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#if defined(TORCHATTN_SIMD_X86)
#include <immintrin.h>
#endif

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

// One group of x's row: its scale, and its n <= kGroup inputs as qx + 128.
float quantize_group(const float* x, int64_t n, uint8_t* out) {
  float amax = 0.0f;
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    finite = finite && a < std::numeric_limits<float>::infinity();
    amax = std::max(amax, a);
  }
  if (!finite) {
    std::memset(out, 128, n);
    return std::numeric_limits<float>::quiet_NaN();
  }
  const float s = amax / 127.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float q = s > 0.0f ? std::nearbyint(x[i] / s) : 0.0f;
    out[i] = static_cast<uint8_t>(static_cast<int>(std::clamp(q, -127.0f, 127.0f)) + 128);
  }
  return s;
}

#if defined(TORCHATTN_SIMD_X86)
// quantize_group for a whole group of 64 with AVX-512: the same divisions and roundings.
__attribute__((target("avx512f,avx512bw"))) float quantize_group_avx512(const float* x, uint8_t* out) {
  __m512 v[4];
  __m512 amax = _mm512_setzero_ps();
  __mmask16 bad = 0;
  const __m512 inf = _mm512_set1_ps(std::numeric_limits<float>::infinity());
  for (int j = 0; j < 4; ++j) {
    v[j] = _mm512_loadu_ps(x + 16 * j);
    const __m512 a = _mm512_abs_ps(v[j]);
    bad |= _mm512_cmp_ps_mask(a, inf, _CMP_NLT_UQ);  // NaN or infinite
    amax = _mm512_max_ps(amax, a);
  }
  if (bad != 0) {
    std::memset(out, 128, kGroup);
    return std::numeric_limits<float>::quiet_NaN();
  }
  const float s = _mm512_reduce_max_ps(amax) / 127.0f;
  if (!(s > 0.0f)) {
    std::memset(out, 128, kGroup);
    return s;
  }
  const __m512 sv = _mm512_set1_ps(s);
  const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  const __m512i bias = _mm512_set1_epi32(128);
  for (int j = 0; j < 4; ++j) {
    __m512 q = _mm512_roundscale_ps(_mm512_div_ps(v[j], sv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm512_min_ps(_mm512_max_ps(q, lo), hi);
    const __m512i u = _mm512_add_epi32(_mm512_cvtps_epi32(q), bias);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16 * j), _mm512_cvtepi32_epi8(u));
  }
  return s;
}

// The same with AVX2: eight registers of eight.
__attribute__((target("avx2,fma"))) float quantize_group_avx2(const float* x, uint8_t* out) {
  __m256 v[8];
  __m256 amax = _mm256_setzero_ps();
  __m256 bad = _mm256_setzero_ps();
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int j = 0; j < 8; ++j) {
    v[j] = _mm256_loadu_ps(x + 8 * j);
    const __m256 a = _mm256_andnot_ps(sign, v[j]);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ));  // NaN or infinite
    amax = _mm256_max_ps(amax, a);
  }
  if (_mm256_movemask_ps(bad) != 0) {
    std::memset(out, 128, kGroup);
    return std::numeric_limits<float>::quiet_NaN();
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  const float s = _mm_cvtss_f32(m) / 127.0f;
  if (!(s > 0.0f)) {
    std::memset(out, 128, kGroup);
    return s;
  }
  const __m256 sv = _mm256_set1_ps(s);
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  const __m256i bias = _mm256_set1_epi32(128);
  for (int j = 0; j < 8; j += 2) {
    __m256i u[2];
    for (int h = 0; h < 2; ++h) {
      __m256 q = _mm256_round_ps(_mm256_div_ps(v[j + h], sv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      q = _mm256_min_ps(_mm256_max_ps(q, lo), hi);
      u[h] = _mm256_add_epi32(_mm256_cvtps_epi32(q), bias);  // 1 .. 255
    }
    // 16 int32 in [1, 255] -> 16 bytes in order: packs work within 128-bit lanes.
    const __m256i w16 = _mm256_permute4x64_epi64(_mm256_packus_epi32(u[0], u[1]), 0xD8);
    const __m128i b8 = _mm_packus_epi16(_mm256_castsi256_si128(w16), _mm256_extracti128_si256(w16, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 8 * j), b8);
  }
  return s;
}
#endif

QuantizedRows quantize_rows(const float* x, int64_t rows, int64_t in, Int8Kernel kernel) {
  QuantizedRows r;
  r.groups = int8_groups(in);
  r.padded_in = r.groups * kGroup;
  r.rows = (rows + kRowTile - 1) / kRowTile * kRowTile;
  r.bytes.assign(static_cast<size_t>(r.rows * r.padded_in), 128);
  r.scale.assign(static_cast<size_t>(r.rows * r.groups), 0.0f);
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(in, 1)), [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      for (int64_t g = 0; g < r.groups; ++g) {
        const int64_t g0 = g * kGroup, n = std::min(kGroup, in - g0);
        const float* src = x + m * in + g0;
        uint8_t* dst = r.bytes.data() + m * r.padded_in + g0;
        float& s = r.scale[m * r.groups + g];
#if defined(TORCHATTN_SIMD_X86)
        if (kernel == Int8Kernel::Vnni && n == kGroup) {
          s = quantize_group_avx512(src, dst);
          continue;
        }
        if (kernel == Int8Kernel::Avx2 && n == kGroup) {
          s = quantize_group_avx2(src, dst);
          continue;
        }
#endif
        s = quantize_group(src, n, dst);
      }
    }
  });
  (void)kernel;
  return r;
}

// The portable loop: the same integers and the same float32 steps as the kernels.
// Outputs [begin, end) of the part for every row.
void portable(const QuantizedRows& xr, int64_t rows, const int8::Int8Call& c, int64_t begin, int64_t end) {
  for (int64_t o = begin; o < end; ++o) {
    for (int64_t m = 0; m < rows; ++m) {
      const uint8_t* xm = xr.bytes.data() + m * xr.padded_in;
      float acc = 0.0f;
      for (int64_t g = 0; g < xr.groups; ++g) {
        const int64_t g0 = g * kGroup, g1 = std::min(c.in, g0 + kGroup);
        int32_t d = 0;
        for (int64_t i = g0; i < g1; ++i) d += (static_cast<int32_t>(xm[i]) - 128) * c.q[o * c.in + i];
        const float t = static_cast<float>(d) * c.scale[o * xr.groups + g];
        acc = std::fma(t, xr.scale[m * xr.groups + g], acc);
      }
      c.y[m * c.ldy + o] = c.bias != nullptr ? acc + c.bias[o] : acc;
    }
  }
}

// The kernel's own rows (at most kFewRows, on this thread) or panels (more, parallel).
void rows_of(Int8Kernel kernel, const QuantizedRows& xr, int64_t rows, const int8::Int8Call& c, int64_t begin,
             int64_t end) {
  switch (kernel) {
#if defined(TORCHATTN_SIMD_X86)
    case Int8Kernel::Vnni:
      int8::vnni_rows(xr, rows, c, begin, end);
      return;
    case Int8Kernel::Avx2:
      int8::avx2_rows(xr, rows, c, begin, end);
      return;
#endif
    default:
      portable(xr, rows, c, begin, end);
  }
}

void panels_of(Int8Kernel kernel, const QuantizedRows& xr, int64_t rows, const int8::Int8Call& c) {
  switch (kernel) {
#if defined(TORCHATTN_SIMD_X86)
    case Int8Kernel::Vnni:
      int8::vnni_panels(xr, rows, c);
      return;
    case Int8Kernel::Avx2:
      int8::avx2_panels(xr, rows, c);
      return;
#endif
    default:
      at::parallel_for(0, c.out, 1, [&](int64_t b, int64_t e) { portable(xr, rows, c, b, e); });
  }
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
#if defined(TORCHATTN_SIMD_X86)
  if (kernel == Int8Kernel::Avx2) int8::avx2_prepare(xr);
#endif
  std::vector<int8::Int8Call> calls;
  float* y0 = y.mutable_data_ptr<float>();
  int64_t col = 0;
  for (const auto& p : parts) {
    calls.push_back({p.data.const_data_ptr<int8_t>(), p.scale.const_data_ptr<float>(), in, p.data.size(0),
                     p.bias.defined() ? p.bias.const_data_ptr<float>() : nullptr, y0 + col, total});
    col += p.data.size(0);
  }
  if (rows > int8::kFewRows) {
    for (const auto& c : calls) panels_of(kernel, xr, rows, c);
    return y;
  }
  // Every part's outputs [0, total) split over the threads at once.
  const int64_t grain = std::max<int64_t>(16, 16384 / std::max<int64_t>(in, 1));
  parallel_for_unless_stalled(total, grain, [&](int64_t begin, int64_t end) {
    int64_t first = 0;
    for (const auto& c : calls) {
      const int64_t b = std::max(begin, first), e = std::min(end, first + c.out);
      if (b < e) rows_of(kernel, xr, rows, c, b - first, e - first);
      first += c.out;
    }
  });
  return y;
}

}  // namespace torchattn::kernels::cpu

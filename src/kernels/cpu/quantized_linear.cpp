#include "kernels/cpu/quantized_linear.h"

#include "kernels/cpu/needs_grad.h"
#include "kernels/cpu/onednn_linear.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/stall_aware.h"
#include "kernels/cpu/vec.h"

#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/amax.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/nonzero.h>
#include <ATen/ops/round.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <vector>

TORCHATTN_SIMD_KERNELS_BEGIN

namespace torchattn::kernels::cpu {

namespace {

// out[0, n) = float(q[0, n)): int8 or bfloat16 (as its bits), exact.
struct Widen {
  static constexpr Isa kWidest = Isa::Avx512;
  template <class S, class T>
  static void run(const T* q, float* out, int64_t n) {
    int64_t i = 0;
    for (; i + S::W <= n; i += S::W) S::store(out + i, S::widen(q + i));
    for (; i < n; ++i) out[i] = simd::Scalar::widen(q + i);
  }
};

// out[k] = sum_i float(q[k][i]) * x[i] for the 4 weight rows q[0..3] (each `in` long):
// one pass over x for all four, each row widened in registers (no buffer), four
// independent accumulators; the last in % W products in order.
struct DotFour {
  static constexpr Isa kWidest = Isa::Avx512;
  template <class S, class T>
  static void run(const T* const* q, const float* x, int64_t in, float* out) {
    using V = typename S::V;
    V a0 = S::zero(), a1 = S::zero(), a2 = S::zero(), a3 = S::zero();
    int64_t i = 0;
    for (; i + S::W <= in; i += S::W) {
      const V xv = S::load(x + i);
      a0 = S::fma(S::widen(q[0] + i), xv, a0);
      a1 = S::fma(S::widen(q[1] + i), xv, a1);
      a2 = S::fma(S::widen(q[2] + i), xv, a2);
      a3 = S::fma(S::widen(q[3] + i), xv, a3);
    }
    out[0] = S::reduce_add(a0);
    out[1] = S::reduce_add(a1);
    out[2] = S::reduce_add(a2);
    out[3] = S::reduce_add(a3);
    for (; i < in; ++i) {
      for (int k = 0; k < 4; ++k) out[k] += simd::Scalar::widen(q[k] + i) * x[i];
    }
  }
};

// Rows [begin, end) of y for x's `rows` rows (at most kFusedRows): DotFour over four
// weight rows at a time (the last group repeats its first row where fewer are left).
template <class T>
void fused_rows(const T* q, int64_t in, int64_t out, int64_t begin, int64_t end, const float* xs, int64_t rows,
                const float* scale, const float* bias, float* ys) {
  const Isa isa = best_isa();
  for (int64_t o = begin; o < end; o += 4) {
    const int64_t n = std::min<int64_t>(4, end - o);
    const T* ptrs[4];
    for (int64_t k = 0; k < 4; ++k) ptrs[k] = q + (o + (k < n ? k : 0)) * in;
    // The group after next on its way from memory while this one is summed: the
    // hardware prefetchers alone leave the weights' stream at half the bandwidth.
    if (o + 12 <= end) {
      const char* ahead = reinterpret_cast<const char*>(q + (o + 8) * in);
      for (int64_t b = 0; b < 4 * in * static_cast<int64_t>(sizeof(T)); b += 64) __builtin_prefetch(ahead + b);
    }
    for (int64_t r = 0; r < rows; ++r) {
      float d[4];
      simd::run_on<DotFour>(isa, static_cast<const T* const*>(ptrs), xs + r * in, in, d);
      for (int64_t k = 0; k < n; ++k) {
        float v = scale != nullptr ? d[k] * scale[o + k] : d[k];
        ys[r * out + o + k] = bias != nullptr ? v + bias[o + k] : v;
      }
    }
  }
}

// Up to this many rows of x the weights are widened in registers once per row of x
// (fused_rows); past it, each weight row once into a buffer that every row of x dots.
constexpr int64_t kFusedRows = 4;

template <class T>
void widen_rows(const T* q, int64_t rows, int64_t in, float* out) {
  const Isa isa = best_isa();
  for (int64_t r = 0; r < rows; ++r) simd::run_on<Widen>(isa, q + r * in, out + r * in, in);
}

const void* data_of(const at::Tensor& data) { return data.const_data_ptr(); }

// Rows [begin, end) of data widened into out ([end - begin, in] floats).
void widen_range(const at::Tensor& data, int64_t begin, int64_t end, float* out) {
  const int64_t in = data.size(1);
  if (data.scalar_type() == at::kChar) {
    widen_rows(static_cast<const int8_t*>(data_of(data)) + begin * in, end - begin, in, out);
  } else {
    widen_rows(static_cast<const uint16_t*>(data_of(data)) + begin * in, end - begin, in, out);
  }
}

bool dense_cpu(const at::Tensor& t, int64_t dim) {
  return t.is_cpu() && t.layout() == at::kStrided && !t.is_nested() && t.dim() == dim && t.is_contiguous();
}

// x [rows, in] contiguous: the matrix-vector kernel.
void matvec(const float* xs, int64_t rows, const at::Tensor& data, const float* scale, const float* bias, float* ys) {
  const int64_t in = data.size(1), out = data.size(0);
  const int64_t grain = std::max<int64_t>(16, 16384 / std::max<int64_t>(in, 1));
  if (rows <= kFusedRows) {
    parallel_for_unless_stalled(out, grain, [&](int64_t begin, int64_t end) {
      if (data.scalar_type() == at::kChar) {
        fused_rows(static_cast<const int8_t*>(data_of(data)), in, out, begin, end, xs, rows, scale, bias, ys);
      } else {
        fused_rows(static_cast<const uint16_t*>(data_of(data)), in, out, begin, end, xs, rows, scale, bias, ys);
      }
    });
    return;
  }
  parallel_for_unless_stalled(out, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> row(static_cast<size_t>(in));
    for (int64_t o = begin; o < end; ++o) {
      widen_range(data, o, o + 1, row.data());
      const float s = scale != nullptr ? scale[o] : 1.0f;
      for (int64_t r = 0; r < rows; ++r) {
        float d = dot(row.data(), xs + r * in, in);
        if (scale != nullptr) d *= s;
        ys[r * out + o] = bias != nullptr ? d + bias[o] : d;
      }
    }
  });
}

// x [rows, in] contiguous, many rows: tiles of output features widened, then a GEMM.
void tiled(const at::Tensor& x, const at::Tensor& data, const at::Tensor& scale, const at::Tensor& bias,
           at::Tensor& y) {
  const int64_t in = data.size(1), out = data.size(0);
  // A tile of about 1 MB of floats: it stays in the cache between its widening and the GEMM.
  const int64_t tile = std::clamp<int64_t>((int64_t{1} << 18) / std::max<int64_t>(in, 1), 16, out);
  at::Tensor buffer = at::empty({tile, in}, x.options());
  for (int64_t o0 = 0; o0 < out; o0 += tile) {
    const int64_t n = std::min(tile, out - o0);
    at::Tensor w = buffer.narrow(0, 0, n);
    float* wp = w.mutable_data_ptr<float>();
    at::parallel_for(0, n, std::max<int64_t>(1, 4096 / std::max<int64_t>(in, 1)),
                     [&](int64_t b, int64_t e) { widen_range(data, o0 + b, o0 + e, wp + b * in); });
    const at::Tensor b = bias.defined() ? bias.narrow(0, o0, n) : at::Tensor();
    at::Tensor part;
    if (scale.defined()) {
      part = onednn_linear_applies(x, w, at::Tensor()) ? onednn_linear(x, w, at::Tensor()) : at::linear(x, w);
      part.mul_(scale.narrow(0, o0, n));
      if (b.defined()) part.add_(b);
    } else {
      part = onednn_linear_applies(x, w, b)
                 ? onednn_linear(x, w, b)
                 : at::linear(x, w, b.defined() ? std::optional<at::Tensor>(b) : std::nullopt);
    }
    y.narrow(1, o0, n).copy_(part);
  }
}

}  // namespace

std::pair<at::Tensor, at::Tensor> quantize_int8_rows(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat,
              "quantize_int8_rows: expected a float32 weight [out, in], got ", weight.sizes(), " of ",
              weight.scalar_type());
  const at::Tensor finite = at::isfinite(weight).all(1);
  if (!finite.all().item<bool>()) {
    const int64_t row = at::nonzero(finite.logical_not())[0][0].item<int64_t>();
    TORCH_CHECK(false, "quantize_int8_rows: expected finite weights, got a NaN or infinity in row ", row);
  }
  const at::Tensor scale = at::amax(at::abs(weight), {1}) / 127.0f;
  const at::Tensor divisor = at::where(scale > 0, scale, at::ones_like(scale)).unsqueeze(1);
  const at::Tensor q = at::round(weight / divisor).clamp_(-127, 127).to(at::kChar);
  return {q.contiguous(), scale.contiguous()};
}

bool quantized_linear_applies(const at::Tensor& x, const at::Tensor& data, const at::Tensor& scale,
                              const at::Tensor& bias) {
  if (!data.defined() || !dense_cpu(data, 2) || data.numel() == 0) return false;
  if (data.scalar_type() == at::kChar) {
    if (!scale.defined() || !dense_cpu(scale, 1) || scale.scalar_type() != at::kFloat ||
        scale.size(0) != data.size(0)) {
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
         x.dim() >= 1 && x.size(-1) == data.size(1) && !needs_grad(x);
}

at::Tensor quantized_linear(const at::Tensor& x_in, const at::Tensor& data, const at::Tensor& scale,
                            const at::Tensor& bias) {
  TORCH_CHECK(quantized_linear_applies(x_in, data, scale, bias),
              "quantized_linear: expected float32 CPU x [..., in] with no gradient, int8 [out, in] data with "
              "float32 scales [out] (or bfloat16 data, no scales) and a float32 bias [out] or none; got x ",
              x_in.sizes(), " of ", x_in.scalar_type(), " on ", x_in.device(), ", data ", data.sizes(), " of ",
              data.scalar_type());
  const int64_t in = data.size(1), out = data.size(0);
  std::vector<int64_t> shape = x_in.sizes().vec();
  shape.back() = out;
  const int64_t rows = in == 0 ? 0 : x_in.numel() / in;
  const at::Tensor x = x_in.reshape({rows, in}).contiguous();
  at::Tensor y = at::empty({rows, out}, x.options());
  if (rows == 0) return y.reshape(shape);
  if (rows <= kQuantizedMatvecRows) {
    matvec(x.const_data_ptr<float>(), rows, data, scale.defined() ? scale.const_data_ptr<float>() : nullptr,
           bias.defined() ? bias.const_data_ptr<float>() : nullptr, y.mutable_data_ptr<float>());
  } else {
    tiled(x, data, scale, bias, y);
  }
  return y.reshape(shape);
}

at::Tensor dequantized_rows(const at::Tensor& data, const at::Tensor& scale, const at::Tensor& ids) {
  TORCH_CHECK(ids.scalar_type() == at::kLong, "dequantized_rows: expected int64 ids, got ", ids.scalar_type());
  TORCH_CHECK(data.dim() == 2 && (data.scalar_type() == at::kChar || data.scalar_type() == at::kBFloat16),
              "dequantized_rows: expected int8 or bfloat16 data [rows, in], got ", data.sizes(), " of ",
              data.scalar_type());
  at::Tensor rows = data.index_select(0, ids.reshape({-1})).to(at::kFloat);
  if (scale.defined()) rows.mul_(scale.index_select(0, ids.reshape({-1})).unsqueeze(1));
  std::vector<int64_t> shape = ids.sizes().vec();
  shape.push_back(data.size(1));
  return rows.reshape(shape);
}

}  // namespace torchattn::kernels::cpu

TORCHATTN_SIMD_KERNELS_END

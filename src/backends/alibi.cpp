#include "backends/alibi.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/scalar_tensor.h>
#include <c10/util/Exception.h>

#include <cmath>

namespace torchattn::backends {

at::Tensor alibi_slopes(int64_t num_heads) {
  TORCH_CHECK(num_heads >= 1, "alibi_slopes: expected num_heads >= 1, got ", num_heads);
  int64_t n = 1;
  while (n * 2 <= num_heads) n *= 2;
  // BLOOM: base = 2^(-(2^-(log2(n) - 3))) as a float32 tensor, raised to int32 powers.
  const auto base_of = [](int64_t m) {
    return std::pow(2.0, -std::pow(2.0, -(std::log2(static_cast<double>(m)) - 3.0)));
  };
  const at::Tensor base = at::scalar_tensor(base_of(n), at::kFloat);
  at::Tensor slopes = at::pow(base, at::arange(1, 1 + n, at::kInt));
  if (n != num_heads) {
    const at::Tensor extra_base = at::scalar_tensor(base_of(2 * n), at::kFloat);
    const int64_t left = std::min(n, num_heads - n);
    slopes = at::cat({slopes, at::pow(extra_base, at::arange(1, 1 + 2 * left, 2, at::kInt))});
  }
  return slopes;
}

at::Tensor alibi_bias(const at::Tensor& slopes, const at::Tensor& key_padding, int64_t Tq, int64_t Tk,
                      c10::ScalarType dtype, const at::Tensor& query_start) {
  const auto compute = dtype == at::kDouble ? at::kDouble : at::kFloat;
  const auto options = slopes.options().dtype(at::kLong);
  // Each key's position among its sequence's real tokens (padding keys: hidden anyway).
  const at::Tensor key_positions = key_padding.defined()
                                       ? key_padding.to(slopes.device()).logical_not().to(at::kLong).cumsum(-1) - 1
                                       : at::arange(Tk, options).unsqueeze(0);  // [B or 1, Tk]
  const at::Tensor query_positions =                                            // [B or 1, Tq]
      query_start.defined()
          ? key_positions.index_select(-1, at::arange(Tq, options) + query_start.to(options).reshape({}))
          : key_positions.narrow(-1, Tk - Tq, Tq);
  const at::Tensor distance = (key_positions.unsqueeze(1) - query_positions.unsqueeze(2)).to(compute);
  return (slopes.to(compute).view({1, -1, 1, 1}) * distance.unsqueeze(1)).to(dtype);
}

}  // namespace torchattn::backends

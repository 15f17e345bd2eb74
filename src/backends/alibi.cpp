#include "backends/alibi.h"

#include <torchattn/flex/variants.h>

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/tensor.h>
#include <c10/util/Exception.h>

#include <cmath>

namespace torchattn::backends {

at::Tensor alibi_slopes(int64_t num_heads) {
  TORCH_CHECK(num_heads >= 1, "alibi_slopes: expected num_heads >= 1, got ", num_heads);
  // The formula's one place is the public flex::Alibi (float32 values held as doubles).
  return at::tensor(flex::Alibi::bloom_slopes(num_heads), at::kDouble).to(at::kFloat);
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

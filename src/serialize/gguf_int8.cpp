// GgufFile::int8_weights: any tensor of a GGUF file as torchattn's int8 weights
// (WeightFormat::Int8: a float32 scale per group of 64 inputs), quantized from its
// float32 values a slice of rows at a time.

#include <torchattn/gguf.h>

#include "kernels/cpu/quantized_linear.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>

namespace torchattn {

std::pair<at::Tensor, at::Tensor> GgufFile::int8_weights(const std::string& name) const {
  const GgufTensorInfo& t = checked_tensor(name);
  TORCH_CHECK(t.shape.size() == 2, "gguf: '", path_, "': tensor '", name, "' has ", t.shape.size(),
              " dimensions; int8_weights takes [out, in]");
  // int8's groups lie within a row, so a slice's rows quantize as the whole's: the
  // token table of a tied model (49152 x 2048 at 1B) is never whole in float32 (402 MB
  // of a load's peak), only 2048 rows of it.
  constexpr int64_t kRowsAStep = 2048;
  const int64_t out = t.shape[0], in = t.shape[1];
  at::Tensor data = at::empty({out, in}, at::kChar);
  at::Tensor scale = at::empty({out, kernels::cpu::int8_groups(in)}, at::kFloat);
  for (int64_t first = 0; first < out; first += kRowsAStep) {
    const int64_t n = std::min(kRowsAStep, out - first);
    auto [q, s] = kernels::cpu::quantize_int8_groups(dequantize_rows(name, first, n));
    data.narrow(0, first, n).copy_(q);
    scale.narrow(0, first, n).copy_(s);
  }
  return {data, scale};
}

}  // namespace torchattn

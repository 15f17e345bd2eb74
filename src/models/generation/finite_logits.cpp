#include "models/generation/finite_logits.h"

#include <ATen/ops/argmax.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/where.h>

namespace torchattn::models::generation {

std::vector<bool> finite_rows(const at::Tensor& logits) {
  const at::Tensor finite = at::isfinite(logits).all(-1).reshape({-1}).to(at::kCPU);
  const bool* p = finite.const_data_ptr<bool>();
  return std::vector<bool>(p, p + finite.numel());
}

std::string non_finite_logits(const std::string& who, int64_t step, const std::string& what) {
  return who + ": the model produced non-finite logits at step " + std::to_string(step) + " (" + what +
         "): NaN or infinity, so no token can be chosen. Its weights are damaged (a saved folder's checksums find "
         "that at load: LoadOptions::verify_weights, on unless --no-verify-weights) or its activations overflow their "
         "dtype";
}

at::Tensor argmax_or_minus_one(const at::Tensor& logits) {
  return at::where(at::isfinite(logits).all(-1), logits.argmax(-1), -1);
}

}  // namespace torchattn::models::generation

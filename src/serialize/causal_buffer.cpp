#include "serialize/causal_buffer.h"

#include <ATen/ops/ones.h>
#include <ATen/ops/triu.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <string>

namespace torchattn::serialize {

bool holds_causal_mask(const at::Tensor& mask, int64_t context_length) {
  if (mask.dim() != 2 || mask.size(0) != context_length || mask.size(1) != context_length) {
    return false;
  }
  constexpr int64_t kRows = 256;
  for (int64_t r = 0; r < context_length; r += kRows) {
    const int64_t n = std::min(kRows, context_length - r);
    // Row r + i has ones where column c > r + i.
    const at::Tensor expected = at::triu(at::ones({n, context_length}, mask.options()), r + 1);
    if (!mask.narrow(0, r, n).equal(expected)) {
      return false;
    }
  }
  return true;
}

void check_causal_mask(const char* fn, const std::string& key, const at::Tensor& mask, int64_t context_length) {
  TORCH_CHECK(holds_causal_mask(mask, context_length), fn, ": checkpoint key '", key, "' of shape ", mask.sizes(),
              " is not the causal mask triu(ones(", context_length, ", ", context_length,
              "), 1) that this mask_buffer(false) module applies; load it into a module with mask_buffer(true)");
}

}  // namespace torchattn::serialize

#include "block/positions.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>

namespace torchattn::block {

at::Tensor token_positions(int64_t T, const KVCache* cache, const at::Tensor& key_padding_mask,
                           const at::Device& device) {
  const auto long_options = at::TensorOptions().dtype(at::kLong).device(device);
  const bool padded = key_padding_mask.defined() || (cache != nullptr && cache->has_padding());
  if (!padded) {
    if (cache == nullptr) {
      return at::arange(T, long_options);
    }
    if (cache->static_shapes()) {
      // One token (a decoding step): the cache's position itself, read before this
      // step's append advances it (stream order), so the step launches no kernel here.
      return T == 1 ? cache->position() : cache->position() + at::arange(T, long_options);
    }
    return at::arange(cache->length(), cache->length() + T, long_options);
  }
  // Real tokens before the new ones, per sequence: [B, 1] (or a [1] count for all).
  const at::Tensor before = cache != nullptr ? cache->token_positions() : at::zeros({1}, long_options);
  const at::Tensor real = key_padding_mask.defined() ? key_padding_mask.logical_not().to(at::kLong)
                                                     : at::ones({1, T}, long_options);
  // cumsum - 1 is the position of each real token; a padding token gets the one of
  // the last real token before it, clamped at 0.
  return (before.view({-1, 1}) + real.cumsum(-1) - 1).clamp_min(0);
}

}  // namespace torchattn::block

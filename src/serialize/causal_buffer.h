#pragma once

// The notebooks' `mask` buffer, triu(ones(C, C), 1), recognised without building it:
// a mask_buffer(false) module accepts a checkpoint's `mask` only when it is this.

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace torchattn::serialize {

/// True when `mask` is [C, C] with ones above the diagonal and zeros elsewhere,
/// compared a block of rows at a time (memory O(rows x C), not C x C).
bool holds_causal_mask(const at::Tensor& mask, int64_t context_length);

/// A c10::Error naming `key` (as `fn`: checkpoint key 'key' ...) unless
/// holds_causal_mask(mask, context_length).
void check_causal_mask(const char* fn, const std::string& key, const at::Tensor& mask, int64_t context_length);

}  // namespace torchattn::serialize

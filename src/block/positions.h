#pragma once

// The position of each new token, for rotary embeddings. Positions count a
// sequence's real tokens: padding is skipped, so in a left-padded batch each
// sequence's first real token is at 0, as transformers' generate counts them
// (position ids from the attention mask's cumulative sum).

#include <torchattn/kv_cache.h>

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace torchattn::block {

/// T new tokens, after those in `cache` (null: none), with their key_padding_mask
/// ([B, T] / [1, T] bool, true = padding, or undefined).
///
/// Returns int64 on `device`: [T] when no token so far or now is padding (past +
/// arange(T), past taken from the device for a static-shape cache), else [B, T]
/// (the real tokens before each one; a padding token gets the position of the real
/// token before it, or 0, and is never seen). No host synchronisation. One token of a
/// static-shape cache without padding: the cache's position() itself, not a copy: read
/// it before the cache's next append.
at::Tensor token_positions(int64_t T, const KVCache* cache, const at::Tensor& key_padding_mask,
                           const at::Device& device);

}  // namespace torchattn::block

#pragma once

// Checksums of weights: XXH64, the 64-bit hash of the xxHash specification
// (https://github.com/Cyan4973/xxHash/blob/dev/doc/xxhash_spec.md), the same value as
// `xxhsum -H64` and Python's `xxhash.xxh64(...).intdigest()`. Saved model folders record
// one per tensor (torchattn_weights.json) and loading checks them; see docs/models.md.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace torchattn {

/// XXH64 of the `size` bytes at `data` with `seed`. `data` may be null when size is 0.
uint64_t xxh64(const void* data, size_t size, uint64_t seed = 0);

/// XXH64 (seed 0) of each tensor's bytes as a safetensors file stores them (row-major,
/// little-endian; a non-contiguous tensor is hashed as its contiguous copy), the tensors
/// spread over ATen's intra-op threads. Each must be a dense CPU tensor.
std::vector<uint64_t> tensor_xxh64(const std::vector<at::Tensor>& tensors);

/// `value` as 16 lowercase hex digits, and back. A string that is not 16 hex digits is
/// an error naming `what`.
std::string checksum_hex(uint64_t value);
uint64_t checksum_from_hex(const std::string& hex, const std::string& what);

}  // namespace torchattn

#pragma once

// Writing a step's new keys and values into a layer's blocks of a PagedKVCache on the
// CPU: a plain copy per token and head, in place of two index_put_ over the permuted
// pool per layer (about 3% of a 16-request decoding step of SmolLM2-135M on 2 cores:
// 28.1 against 29.0 ms). The same bits as index_put_: each slot receives one token's
// values (tests/cache/test_paged_kv_cache.cpp compares them).

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace torchattn::kernels::cpu {

/// Whether paged_write applies: CPU tensors of one floating dtype; the storages
/// contiguous (a layer's pool); k and v with unit stride in their last dimension.
bool paged_write_applies(const at::Tensor& k, const at::Tensor& v, const at::Tensor& keys, const at::Tensor& values);

/// k, v: [N, Hkv, d]; keys: [num_blocks, Hkv, d, block_size] (transposed within a
/// block); values: [num_blocks, Hkv, block_size, d]; blocks, offsets: N slots, token i
/// to block blocks[i] at offset offsets[i] (in range, as PagedKVCache::begin_step makes
/// them).
void paged_write(const at::Tensor& k, const at::Tensor& v, const int64_t* blocks, const int64_t* offsets,
                 at::Tensor& keys, at::Tensor& values);

}  // namespace torchattn::kernels::cpu

#pragma once

// A static-shape KV cache's write on CUDA: the new keys and values into their slots at
// the cache's device-side position, both in one launch (two index_copy_ calls did it in
// two, after two small kernels for the index). Only a build with a CUDA LibTorch
// defines these (TORCHATTN_WITH_CUDA); KVCache::append calls them.

#include <ATen/core/Tensor.h>

namespace torchattn::kernels::cuda {

/// Whether static_cache_write applies: keys and values [..., C, d] contiguous, of one
/// shape, dtype and CUDA device, rank 3 or 4; k and v [..., t, d] of that dtype and
/// device with the caches' other sizes (any strides); position a [1] int64 tensor there.
bool static_cache_write_applies(const at::Tensor& keys, const at::Tensor& values, const at::Tensor& k,
                                const at::Tensor& v, const at::Tensor& position);

/// keys[..., position + i, :] = k[..., i, :] and values likewise, for i < t, the
/// position read on the device (no host synchronisation: a CUDA graph can capture it).
/// Slots at C or past it are not written (the caller checks room on the host). Needs
/// static_cache_write_applies.
void static_cache_write(at::Tensor& keys, at::Tensor& values, const at::Tensor& k, const at::Tensor& v,
                        const at::Tensor& position);

}  // namespace torchattn::kernels::cuda

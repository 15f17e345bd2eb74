#pragma once

// Attention over a PagedKVCache for one step: the rows of each sequence attend
// causally (and within a window) over that sequence's keys only.

#include <torchattn/attention_options.h>
#include <torchattn/paged_kv_cache.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace torchattn::detail {

/// q: [N, H, head_dim], the step's new rows (rotated where the module has RoPE), and
/// keys, values: a layer's storage (PagedKVCache::keys and values) holding
/// the step's keys already. alibi_slopes: [H] float32 (undefined: no ALiBi); the
/// config's softcap and sinks apply as in `attend`. Returns [N, H, head_dim].
///
/// Sequences with at most kernels::cpu::kPagedKernelRows new rows (decoding, short
/// chunks) take the CPU kernel where it applies (float32, Backend::Auto); the others,
/// and every sequence on other devices, dtypes or backends, gather their keys and take
/// the attention dispatcher (detail::attend) alone, as a contiguous cache would.
at::Tensor paged_attend(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values, const PagedStep& step,
                        const std::optional<int64_t>& window, const functional::AttentionOptions& config,
                        const at::Tensor& alibi_slopes = at::Tensor());

}  // namespace torchattn::detail

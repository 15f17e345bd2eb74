#pragma once

// Attention over a paged pool of keys and values for one step: the rows of each
// sequence attend causally (and within a window) over that sequence's keys only. The
// block hands the backends what it has, the pool and the step's block tables as key
// slots, and the backends choose the kernel, as they do for contiguous keys (attend).

#include <torchattn/attention_options.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace torchattn::backends {

/// A layer's pool and one step's tables (PagedKVCache and PagedStep, cache level):
/// keys [num_blocks, Hkv, head_dim, block_size] (each block's keys transposed, a token
/// per column) and values [num_blocks, Hkv, block_size, head_dim], holding the step's
/// keys already. Sequence s brings the q rows query_start[s] .. query_start[s + 1] (the
/// last of its key_start[s + 1] - key_start[s] tokens), and its token p sits at slot
/// key_slots[key_start[s] + p] (block * block_size + offset): int64 on the pool's
/// device, and the same on the CPU (key_slots_cpu).
struct PagedKeys {
  at::Tensor keys;
  at::Tensor values;
  at::Tensor key_slots;
  at::Tensor key_slots_cpu;
  const std::vector<int64_t>* query_start = nullptr;
  const std::vector<int64_t>* key_start = nullptr;
};

/// keys or values of a pool (keys: true), as laid out above, viewed as [num_blocks,
/// block_size, Hkv, head_dim] (PagedKVCache::by_token).
at::Tensor paged_by_token(const at::Tensor& storage, bool keys);

/// q: [N, H, head_dim], the step's new rows (rotated where the module has RoPE).
/// alibi_slopes: [H] float32 (undefined: no ALiBi); the config's softcap and sinks
/// apply as in `attend`. Returns [N, H, head_dim].
///
/// Sequences with at most kernels::cpu::kPagedKernelRows new rows (decoding, short
/// chunks) take the CPU paged kernel where it applies (float32, Backend::Auto), reading
/// the blocks in place; the others, and every sequence on other devices, dtypes or
/// backends, gather their keys and take attend alone, as a contiguous cache would (the
/// table's paths `cpu_paged_kernel` and `paged_gather`, selector.h).
at::Tensor attend_paged(const at::Tensor& q, const PagedKeys& pool, const std::optional<int64_t>& window,
                        const functional::AttentionOptions& config, const at::Tensor& alibi_slopes = at::Tensor());

struct AttentionCall;

/// The sequences `sequences` of a paged call (call.paged set; call.spec holds the window
/// and ALiBi's slopes) with their keys gathered into contiguous tensors, each through
/// attend alone; their rows written into out [N, H, head_dim].
void attend_gathered(const AttentionCall& call, const std::vector<int64_t>& sequences, at::Tensor& out);

}  // namespace torchattn::backends

#pragma once

// Building a PagedStep's tables from its sequences' block tables, once the cache has
// made room for the step's tokens: where each sequence's new tokens sit among the
// packed rows, their positions, the block and offset each is written at (the slot
// mapping), and the slots of every key each sequence reads.

#include <torchattn/paged_kv_cache.h>

#include "cache/block_allocator.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace torchattn::cache {

/// Fills step's public tables. tokens: the step's sequences and counts (checked by the
/// cache: each sequence once, each count >= 1); tables[s]: tokens[s].sequence's block
/// table, its length already advanced by tokens[s].count and its blocks covering it.
/// positions, write_blocks, write_offsets and key_slots are int64 on `device` (the
/// cache's), key_slots_cpu on the CPU. Returns the largest new token's position (-1
/// for no tokens), the step's max_position().
int64_t fill_step_tables(PagedStep& step, const std::vector<StepTokens>& tokens,
                         const std::vector<const BlockTable*>& tables, int64_t block_size, const at::Device& device);

/// The block and the offset in it of each of `table`'s table.length tokens, oldest
/// first: two int64 tensors [table.length] on `device`.
std::pair<at::Tensor, at::Tensor> token_places(const BlockTable& table, int64_t block_size, const at::Device& device);

}  // namespace torchattn::cache

// Building a PagedStep's tables (packed rows, positions, slot mapping, key slots) from
// its sequences' block tables.

#include "cache/paged_step.h"

#include <ATen/ops/empty.h>

#include <algorithm>

namespace torchattn::cache {

namespace {

// Host int64 values as a tensor [v.size()] on `device`.
at::Tensor step_longs(const std::vector<int64_t>& v, const at::Device& device) {
  at::Tensor cpu = at::empty({static_cast<int64_t>(v.size())}, at::TensorOptions().dtype(at::kLong));
  std::copy(v.begin(), v.end(), cpu.mutable_data_ptr<int64_t>());
  return device.is_cpu() ? cpu : cpu.to(device, /*non_blocking=*/false);
}

}  // namespace

// Sequence s's new tokens are positions [length - count, length) of its table; its keys
// every position [0, length).
int64_t fill_step_tables(PagedStep& step, const std::vector<StepTokens>& tokens,
                         const std::vector<const BlockTable*>& tables, int64_t block_size, const at::Device& device) {
  std::vector<int64_t> positions, write_blocks, write_offsets, key_slots;
  int64_t max_position = -1;
  step.query_start.push_back(0);
  step.key_start.push_back(0);
  for (size_t s = 0; s < tokens.size(); ++s) {
    const StepTokens& t = tokens[s];
    const BlockTable& q = *tables[s];
    for (int64_t p = q.length - t.count; p < q.length; ++p) {
      positions.push_back(p);
      write_blocks.push_back(q.blocks[static_cast<size_t>(p / block_size)]);
      write_offsets.push_back(p % block_size);
    }
    for (int64_t p = 0; p < q.length; ++p) {
      key_slots.push_back(q.blocks[static_cast<size_t>(p / block_size)] * block_size + p % block_size);
    }
    step.sequences.push_back(t.sequence);
    step.query_start.push_back(step.query_start.back() + t.count);
    step.context_lengths.push_back(q.length);
    step.key_start.push_back(static_cast<int64_t>(key_slots.size()));
    max_position = std::max(max_position, q.length - 1);
  }
  step.positions = step_longs(positions, device);
  step.write_blocks = step_longs(write_blocks, device);
  step.write_offsets = step_longs(write_offsets, device);
  step.key_slots_cpu = step_longs(key_slots, at::kCPU);
  step.key_slots = device.is_cpu() ? step.key_slots_cpu : step.key_slots_cpu.to(device);
  return max_position;
}

// Token p at block table.blocks[p / block_size], offset p % block_size.
std::pair<at::Tensor, at::Tensor> token_places(const BlockTable& table, int64_t block_size, const at::Device& device) {
  std::vector<int64_t> blocks, offsets;
  for (int64_t p = 0; p < table.length; ++p) {
    blocks.push_back(table.blocks[static_cast<size_t>(p / block_size)]);
    offsets.push_back(p % block_size);
  }
  return {step_longs(blocks, device), step_longs(offsets, device)};
}

}  // namespace torchattn::cache

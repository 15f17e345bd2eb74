// PagedKVCache's block allocator: the free list (lowest first), each block's holders,
// and when a block table must copy its last block before writing (copy on write).

#include "cache/block_allocator.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace torchattn::cache {

// num_blocks blocks of block_size tokens, all free, none touched.
BlockAllocator::BlockAllocator(int64_t num_blocks, int64_t block_size)
    : num_blocks_(num_blocks), block_size_(block_size), refs_(static_cast<size_t>(num_blocks), 0) {
  for (int64_t b = 0; b < num_blocks; ++b) free_.push(b);
}

// The lowest free block, now with one holder; the blocks ever taken grow to cover it.
int64_t BlockAllocator::take() {
  TORCH_INTERNAL_ASSERT(!free_.empty(), "BlockAllocator: no free block to take");
  const int64_t b = free_.top();
  free_.pop();
  touched_ = std::max(touched_, b + 1);
  refs_[static_cast<size_t>(b)] = 1;
  return b;
}

// A held block: one holder more.
void BlockAllocator::share(int64_t block) { ++refs_[static_cast<size_t>(block)]; }

// A held block: one holder fewer; back on the free list at none.
int32_t BlockAllocator::release(int64_t block) {
  const int32_t left = --refs_[static_cast<size_t>(block)];
  if (left == 0) free_.push(block);
  return left;
}

// Partly filled last block (length not a multiple of block_size) with another holder.
bool BlockAllocator::must_copy(const BlockTable& table) const {
  return table.length % block_size_ != 0 && holders(table.blocks.back()) > 1;
}

// New blocks past the table for length + count tokens, plus one for a copy on write.
int64_t BlockAllocator::needed(const BlockTable& table, int64_t count) const {
  int64_t n = blocks_for(table.length + count) - static_cast<int64_t>(table.blocks.size());
  if (must_copy(table)) ++n;
  return n;
}

}  // namespace torchattn::cache

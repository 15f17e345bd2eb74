#pragma once

// PagedKVCache's block allocator: which blocks of the pool are free (the lowest given
// first), how many holders each block has (sequences, and the prefix cache's one hold
// on a published block), which blocks were ever taken, and the copy-on-write
// bookkeeping of a sequence's block table (a partly filled last block that others hold
// is copied before it is written). It holds no keys or values, and no policy: the
// prefix cache decides which block a sequence gets next, the cache copies storage.

#include <cstdint>
#include <functional>
#include <queue>
#include <vector>

namespace torchattn::cache {

/// A sequence's place in the pool: its blocks, in order, and the tokens it holds in
/// them (the last block may be partly filled).
struct BlockTable {
  std::vector<int64_t> blocks;
  int64_t length = 0;
};

class BlockAllocator {
 public:
  /// num_blocks >= 1 and block_size >= 1 (the cache checks them): every block free.
  BlockAllocator(int64_t num_blocks, int64_t block_size);

  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  /// Blocks no one holds.
  int64_t free() const { return static_cast<int64_t>(free_.size()); }
  /// The block take() gives next: the lowest free one (free() > 0).
  int64_t lowest_free() const { return free_.top(); }
  /// True when `block` was ever taken (its memory was touched). Blocks are taken lowest
  /// first, so the blocks ever taken are [0, some count).
  bool touched(int64_t block) const { return block < touched_; }
  /// Takes the lowest free block (free() > 0) for one holder; returns it.
  int64_t take();
  /// One more holder of `block` (held already).
  void share(int64_t block);
  /// One holder fewer of `block` (held); it is free again when none is left. Returns
  /// the holders left.
  int32_t release(int64_t block);
  /// The holders of `block`, in [0, num_blocks).
  int32_t holders(int64_t block) const { return refs_[static_cast<size_t>(block)]; }

  /// Blocks that hold `tokens` tokens (>= 0).
  int64_t blocks_for(int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }
  /// True when `table`'s last block is partly filled and has other holders: writing
  /// into it needs a copy of its own first.
  bool must_copy(const BlockTable& table) const;
  /// Blocks `table` needs to write `count` (>= 1) more tokens: new ones past its blocks,
  /// and a copy of its last block when must_copy.
  int64_t needed(const BlockTable& table, int64_t count) const;

 private:
  int64_t num_blocks_ = 0, block_size_ = 0;
  std::vector<int32_t> refs_;  // holders of each block
  int64_t touched_ = 0;        // blocks ever taken: [0, touched_) (taken lowest first)
  std::priority_queue<int64_t, std::vector<int64_t>, std::greater<>> free_;  // lowest first
};

}  // namespace torchattn::cache

#pragma once

// PagedKVCache's prefix-cache policy over its block allocator and the PrefixIndex:
// publishing a sequence's full blocks under their token prefix (the index holding each
// published block once), reusing them for a new sequence whose tokens start the same,
// keeping them when no sequence holds them, and giving the kept ones back, least
// recently released first, when the pool needs blocks and none it ever used is free.
//
// Every block a sequence takes or releases goes through here (take, hold, release), so
// that a published block is counted reusable exactly while the index is its only holder.

#include "cache/block_allocator.h"
#include "cache/prefix_index.h"

#include <cstdint>
#include <vector>

namespace torchattn::cache {

class PrefixCache {
 public:
  /// Over `blocks`, which must outlive it (the cache's state holds both).
  explicit PrefixCache(BlockAllocator& blocks) : blocks_(blocks) {}

  /// Published blocks no sequence holds (kept for reuse).
  int64_t reusable() const { return index_.reusable(); }
  /// Blocks a sequence can take: the free ones and the reusable ones.
  int64_t available() const { return blocks_.free() + index_.reusable(); }

  /// A block for one sequence (available() > 0): the lowest free block, unless it was
  /// never used yet and a reusable one can be given back (least recently released
  /// first), so that kept blocks live in memory the pool already uses.
  int64_t take();
  /// One holder fewer of a held `block`; a published block only the index holds now
  /// becomes reusable.
  void release(int64_t block);

  /// Reuse: the longest chain of published whole blocks starting `tokens`, at most
  /// tokens.size() - 1 tokens (one is left to compute). Appends the blocks to `table`
  /// (empty) and their prefix ids to `prefix_ids` (empty), holds each for the table's
  /// sequence, and sets table.length to the tokens they hold.
  void reuse(const std::vector<int64_t>& tokens, BlockTable& table, std::vector<uint64_t>& prefix_ids);
  /// Publishes `table`'s full blocks past its first prefix_ids.size() (published
  /// already) under the token prefix they hold: `tokens`, at least table.length of them
  /// (the cache checks it). Appends each block's prefix id to `prefix_ids`; the index
  /// holds each block it publishes (one holder more).
  void publish(const BlockTable& table, const std::vector<int64_t>& tokens, std::vector<uint64_t>& prefix_ids);

 private:
  BlockAllocator& blocks_;
  PrefixIndex index_;
};

}  // namespace torchattn::cache

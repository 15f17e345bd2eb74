#include "cache/prefix_index.h"

#include <c10/util/Exception.h>

namespace torchattn::cache {

uint64_t PrefixIndex::publish(int64_t block, uint64_t parent, Tokens tokens) {
  auto key = std::make_pair(parent, std::move(tokens));
  if (const auto it = by_prefix_.find(key); it != by_prefix_.end()) return blocks_.at(it->second).id;
  TORCH_INTERNAL_ASSERT(blocks_.count(block) == 0, "PrefixIndex: block ", block, " is published already");
  const uint64_t id = next_id_++;
  blocks_[block] = Entry{id, parent, key.second, 0};
  by_prefix_.emplace(std::move(key), block);
  return id;
}

std::optional<int64_t> PrefixIndex::find(uint64_t parent, const Tokens& tokens) const {
  const auto it = by_prefix_.find(std::make_pair(parent, tokens));
  if (it == by_prefix_.end()) return std::nullopt;
  return it->second;
}

uint64_t PrefixIndex::id(int64_t block) const {
  const auto it = blocks_.find(block);
  return it == blocks_.end() ? 0 : it->second.id;
}

void PrefixIndex::unheld(int64_t block) {
  Entry& e = blocks_.at(block);
  e.released = ++clock_;
  lru_.emplace(e.released, block);
}

void PrefixIndex::held(int64_t block) { lru_.erase({blocks_.at(block).released, block}); }

int64_t PrefixIndex::evict() {
  TORCH_INTERNAL_ASSERT(!lru_.empty(), "PrefixIndex: no reusable block to evict");
  const int64_t block = lru_.begin()->second;
  lru_.erase(lru_.begin());
  const auto it = blocks_.find(block);
  by_prefix_.erase(std::make_pair(it->second.parent, it->second.tokens));
  blocks_.erase(it);
  return block;
}

}  // namespace torchattn::cache

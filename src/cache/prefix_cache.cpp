// PagedKVCache's prefix-cache policy: publishing full blocks, reusing them, and giving
// back the kept ones least recently released first.

#include "cache/prefix_cache.h"

namespace torchattn::cache {

// A free block the pool used before, else a kept one given back (the index's hold
// passes to the sequence), else a never used free block.
int64_t PrefixCache::take() {
  if (blocks_.free() > 0 && (blocks_.touched(blocks_.lowest_free()) || index_.reusable() == 0)) return blocks_.take();
  return index_.evict();
}

// Down to the index's hold alone: reusable from now on.
void PrefixCache::release(int64_t block) {
  if (blocks_.release(block) == 1 && index_.id(block) != 0) index_.unheld(block);
}

// Whole blocks of tokens[0, tokens.size() - 1), matched block by block down the chain.
void PrefixCache::reuse(const std::vector<int64_t>& tokens, BlockTable& table, std::vector<uint64_t>& prefix_ids) {
  const int64_t block_size = blocks_.block_size();
  const auto whole = static_cast<int64_t>(tokens.empty() ? 0 : (tokens.size() - 1)) / block_size;
  uint64_t parent = 0;
  for (int64_t i = 0; i < whole; ++i) {
    const std::vector<int64_t> part(tokens.begin() + i * block_size, tokens.begin() + (i + 1) * block_size);
    const std::optional<int64_t> b = index_.find(parent, part);
    if (!b) break;
    if (blocks_.holders(*b) == 1) index_.held(*b);  // only the index held it: not reusable any more
    blocks_.share(*b);
    table.blocks.push_back(*b);
    parent = index_.id(*b);
    prefix_ids.push_back(parent);
  }
  table.length = static_cast<int64_t>(table.blocks.size()) * block_size;
}

// Full blocks [prefix_ids.size(), table.length / block_size), each under its parent's id
// and its own block_size tokens.
void PrefixCache::publish(const BlockTable& table, const std::vector<int64_t>& tokens,
                          std::vector<uint64_t>& prefix_ids) {
  const int64_t block_size = blocks_.block_size();
  for (auto i = static_cast<int64_t>(prefix_ids.size()); i < table.length / block_size; ++i) {
    const int64_t b = table.blocks[static_cast<size_t>(i)];
    if (const uint64_t id = index_.id(b); id != 0) {  // published through a fork sharing it
      prefix_ids.push_back(id);
      continue;
    }
    const uint64_t parent = prefix_ids.empty() ? 0 : prefix_ids.back();
    const uint64_t id = index_.publish(b, parent,
                                       {tokens.begin() + i * block_size, tokens.begin() + (i + 1) * block_size});
    if (index_.id(b) == id) blocks_.share(b);  // the index's hold (else another block has these tokens)
    prefix_ids.push_back(id);
  }
}

}  // namespace torchattn::cache

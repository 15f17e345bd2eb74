#pragma once

// The bookkeeping of PagedKVCache's prefix caching: which full blocks hold the keys and
// values of which token prefix, and which of them no sequence holds (reusable, and
// evicted least recently used first when the pool needs blocks).
//
// A published block is named by its parent (the published block before it in its
// sequence, 0 for none) and its own tokens, and gets an id of its own (never reused),
// so that a chain of blocks is matched exactly, token for token: an evicted block's
// children are never found again (their parent's id is gone).

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

namespace torchattn::cache {

class PrefixIndex {
 public:
  using Tokens = std::vector<int64_t>;

  /// Publishes `block` under (parent, tokens); returns its id. If another block has that
  /// key already, nothing is published and that block's id is returned.
  uint64_t publish(int64_t block, uint64_t parent, Tokens tokens);
  /// The block published under (parent, tokens), if any.
  std::optional<int64_t> find(uint64_t parent, const Tokens& tokens) const;
  /// The id `block` is published under, or 0.
  uint64_t id(int64_t block) const;

  /// A published block no sequence holds any more (reusable) ...
  void unheld(int64_t block);
  /// ... or held again by a sequence.
  void held(int64_t block);
  /// Published blocks no sequence holds.
  int64_t reusable() const { return static_cast<int64_t>(lru_.size()); }
  /// Forgets the least recently released reusable block and returns it (reusable() > 0).
  int64_t evict();

 private:
  struct Entry {
    uint64_t id = 0, parent = 0;
    Tokens tokens;
    uint64_t released = 0;  // when it was last released: its place in lru_
  };
  std::map<int64_t, Entry> blocks_;                           // published block -> its entry
  std::map<std::pair<uint64_t, Tokens>, int64_t> by_prefix_;  // (parent id, tokens) -> block
  std::set<std::pair<uint64_t, int64_t>> lru_;                // (released, block), no sequence holds it
  uint64_t next_id_ = 1, clock_ = 0;
};

}  // namespace torchattn::cache

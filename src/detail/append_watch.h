#pragma once

// Which KV caches a piece of code appends to, on this thread: DecodeGraph watches its
// step's eager run and refuses a step that writes a cache it was not given (a CUDA
// replay would leave that cache's host length behind). Scoped to one AppendWatch on
// the current thread; nothing process-wide.

#include <vector>

namespace torchattn {
class KVCache;
}

namespace torchattn::detail {

class AppendWatch {
 public:
  AppendWatch();
  ~AppendWatch();
  AppendWatch(const AppendWatch&) = delete;
  AppendWatch& operator=(const AppendWatch&) = delete;

  /// The caches appended to while this watch was the current one, each once.
  const std::vector<const KVCache*>& written() const { return written_; }

 private:
  friend void note_append(const KVCache* cache);
  std::vector<const KVCache*> written_;
  AppendWatch* outer_;
};

/// Called by KVCache::append: records the cache in the current watch, if any.
void note_append(const KVCache* cache);

} // namespace torchattn::detail

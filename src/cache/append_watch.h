#pragma once

// Which KV caches a piece of code appends to, on this thread: DecodeGraph watches its
// step's eager run and refuses a step that writes a cache it was not given (a CUDA
// replay would leave that cache's host length behind). Scoped to one AppendWatch on
// the current thread (an inner watch passes what it saw on to the outer one when it
// ends); nothing process-wide.

#include <cstdint>
#include <vector>

namespace torchattn {
class KVCache;
}

namespace torchattn::cache {

/// One cache appended to: its address (only compared, never followed: the cache may
/// be gone by the time the watch is read) and what an error message says of it.
struct CacheWrite {
  const KVCache* cache;
  bool static_shapes;
  int64_t length;  // after the append
};

class AppendWatch {
 public:
  AppendWatch();
  ~AppendWatch();
  AppendWatch(const AppendWatch&) = delete;
  AppendWatch& operator=(const AppendWatch&) = delete;

  /// The caches appended to while this watch was the current one, each once (the
  /// latest append's length).
  const std::vector<CacheWrite>& written() const { return written_; }

 private:
  friend void note_append(const KVCache* cache, bool static_shapes, int64_t length);
  void add(const CacheWrite& w);
  std::vector<CacheWrite> written_;
  AppendWatch* outer_;
};

/// Called by KVCache::append: records the cache in the current watch, if any.
void note_append(const KVCache* cache, bool static_shapes, int64_t length);

}  // namespace torchattn::cache

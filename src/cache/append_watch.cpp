#include "cache/append_watch.h"

namespace torchattn::cache {

namespace {
thread_local AppendWatch* current_watch = nullptr;
}

AppendWatch::AppendWatch() : outer_(current_watch) { current_watch = this; }

AppendWatch::~AppendWatch() {
  current_watch = outer_;
  if (outer_ != nullptr) {
    for (const CacheWrite& w : written_) outer_->add(w);
  }
}

void AppendWatch::add(const CacheWrite& w) {
  for (CacheWrite& seen : written_) {
    if (seen.cache == w.cache) {
      seen = w;
      return;
    }
  }
  written_.push_back(w);
}

void note_append(const KVCache* cache, bool static_shapes, int64_t length) {
  if (current_watch != nullptr) current_watch->add({cache, static_shapes, length});
}

}  // namespace torchattn::cache

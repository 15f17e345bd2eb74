#include "append_watch.h"

#include <algorithm>

namespace torchattn::detail {

namespace {
thread_local AppendWatch* current_watch = nullptr;
}

AppendWatch::AppendWatch() : outer_(current_watch) {
  current_watch = this;
}

AppendWatch::~AppendWatch() {
  current_watch = outer_;
}

void note_append(const KVCache* cache) {
  AppendWatch* w = current_watch;
  if (w != nullptr && std::find(w->written_.begin(), w->written_.end(), cache) == w->written_.end()) {
    w->written_.push_back(cache);
  }
}

} // namespace torchattn::detail

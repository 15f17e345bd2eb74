#pragma once

// The words a BPE tokenizer has merged, and their ids, for the next time they come: for
// threads at once, and bounded (a server's clients send new words without end): words
// longer than max_bytes are never kept, and once it holds max_words it keeps no more.

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace torchattn::models::text {

class WordCache {
 public:
  WordCache(size_t max_bytes, size_t max_words) : max_bytes_(max_bytes), max_words_(max_words) {}

  /// Appends the ids of `word` to `out` if it is kept; false otherwise.
  bool find(const std::string& word, std::vector<int64_t>& out) const {
    if (word.size() > max_bytes_) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = words_.find(word);
    if (it == words_.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }

  /// Keeps `word`'s ids, within the bounds.
  void keep(const std::string& word, const std::vector<int64_t>& ids) const {
    if (word.size() > max_bytes_) return;
    std::lock_guard<std::mutex> lock(mutex_);
    if (words_.size() < max_words_) words_.emplace(word, ids);
  }

 private:
  size_t max_bytes_, max_words_;
  mutable std::mutex mutex_;
  mutable std::unordered_map<std::string, std::vector<int64_t>> words_;
};

}  // namespace torchattn::models::text

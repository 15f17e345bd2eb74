#include "text_stream.h"

#include <algorithm>

namespace serve {

TextStream::TextStream(const torchattn::models::Tokenizer& tokenizer, std::vector<int64_t> hidden,
                       std::vector<std::string> stop, std::vector<int64_t> context)
    : decoder_(tokenizer, false, std::move(context)), hidden_(std::move(hidden)), stop_(std::move(stop)) {}

std::string TextStream::take(std::string piece) {
  if (stopped_) return "";
  held_ += piece;
  // The first stop sequence in what is held ends the text there.
  size_t first = std::string::npos;
  for (const auto& s : stop_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    std::string out = held_.substr(0, first);
    held_.clear();
    stopped_ = true;
    text_ += out;
    return out;
  }
  // Hold back the longest end of the text that begins some stop sequence.
  size_t keep = 0;
  for (const auto& s : stop_) {
    for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n) {
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  text_ += out;
  return out;
}

std::string TextStream::push(int64_t token) {
  if (stopped_ || std::find(hidden_.begin(), hidden_.end(), token) != hidden_.end()) return "";
  return take(decoder_.push(token));
}

std::string TextStream::finish() {
  std::string out = take(decoder_.finish());
  if (stopped_) return out;
  out += held_;  // no stop sequence came: what was held is text after all
  text_ += held_;
  held_.clear();
  return out;
}

}  // namespace serve

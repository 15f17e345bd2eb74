// DecodeStream: a generation's ids to text a token at a time, the same text decode gives
// all of them (tokenizers' DecodeStream, with an end).

#include <torchattn/models/tokenizer.h>

#include <c10/util/Exception.h>

#include <algorithm>

namespace torchattn::models {

namespace {

// Whether `text` ends inside a UTF-8 character (a byte-level BPE's bytes) or with U+FFFD
// (what a SentencePiece decoder makes of a character's bytes while they are incomplete).
bool unfinished(std::string_view text) {
  if (text.ends_with("\xEF\xBF\xBD")) return true;
  for (size_t back = 1; back <= std::min<size_t>(4, text.size()); ++back) {
    const auto c = static_cast<unsigned char>(text[text.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back;
  }
  return false;
}

}  // namespace

DecodeStream::DecodeStream(const Tokenizer& tokenizer, bool skip_special_tokens, std::vector<int64_t> context)
    : tokenizer_(&tokenizer), skip_special_tokens_(skip_special_tokens) {
  if (context.empty()) return;
  std::string text = tokenizer_->decode(context, skip_special_tokens_);
  if (unfinished(text)) return;
  prefix_index_ = context.size();
  ids_ = std::move(context);
  prefix_ = std::move(text);
}

std::string DecodeStream::push(int64_t id) {
  ids_.push_back(id);
  std::string text;
  try {
    text = tokenizer_->decode(ids_, skip_special_tokens_);
  } catch (...) {
    ids_.pop_back();  // a bad id leaves the stream as it was
    throw;
  }
  if (text.size() <= prefix_.size() || unfinished(text)) return "";
  TORCH_CHECK(text.starts_with(prefix_), "DecodeStream: the text of ", ids_.size(),
              " tokens does not begin with the text of the first ", prefix_index_,
              " (a tokenizer whose decoding of a token changes the text before it)");
  std::string out = text.substr(prefix_.size());
  const size_t next_prefix_index = ids_.size() - prefix_index_;
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_index_));
  prefix_ = tokenizer_->decode(ids_, skip_special_tokens_);
  prefix_index_ = next_prefix_index;
  return out;
}

std::string DecodeStream::finish() {
  const std::string text = tokenizer_->decode(ids_, skip_special_tokens_);
  // Where the held tokens changed the text already given (a character's bytes, then
  // bytes that never make one: decode turns the whole run into U+FFFD), they alone.
  std::string out = text.starts_with(prefix_)
                        ? text.substr(std::min(prefix_.size(), text.size()))
                        : tokenizer_->decode(std::vector<int64_t>(ids_.begin() +
                                                                      static_cast<std::ptrdiff_t>(prefix_index_),
                                                                  ids_.end()),
                                             skip_special_tokens_);
  ids_.clear();
  prefix_.clear();
  prefix_index_ = 0;
  return out;
}

}  // namespace torchattn::models

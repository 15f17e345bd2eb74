// DecodeStream: a generation's ids to text a token at a time, the same text decode gives
// all of them (tokenizers' DecodeStream, with an end).

#include <torchattn/models/tokenizer.h>

#include <c10/util/Exception.h>

#include <algorithm>

namespace torchattn::models {

namespace {

// Tokens held back at most (DecodeStream::push).
constexpr size_t kMostHeld = 8;

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
  // Past kMostHeld tokens since the last text given, what they make is given even where
  // it ends in U+FFFD or adds nothing (skipped special tokens): a character's bytes are at
  // most four tokens, so that text is final, and the tokens decoded again at each push
  // stay bounded (else a run of bytes that never make a character, or of skipped tokens,
  // would be decoded whole at every push: quadratic in its length). Where those bytes
  // turned the text already given into U+FFFD (decode's whole run), they alone, as finish
  // gives them.
  const bool flush = ids_.size() - prefix_index_ > kMostHeld;
  if (!flush && (text.size() <= prefix_.size() || unfinished(text))) return "";
  std::string out;
  if (text.starts_with(prefix_)) {
    out = text.substr(prefix_.size());
  } else {
    TORCH_CHECK(flush, "DecodeStream: the text of ", ids_.size(), " tokens does not begin with the text of the first ",
                prefix_index_, " (a tokenizer whose decoding of a token changes the text before it)");
    out = tokenizer_->decode(held(), skip_special_tokens_);
  }
  const size_t next_prefix_index = ids_.size() - prefix_index_;
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_index_));
  prefix_ = tokenizer_->decode(ids_, skip_special_tokens_);
  prefix_index_ = next_prefix_index;
  return out;
}

std::vector<int64_t> DecodeStream::held() const {
  return {ids_.begin() + static_cast<std::ptrdiff_t>(prefix_index_), ids_.end()};
}

std::string DecodeStream::finish() {
  const std::string text = tokenizer_->decode(ids_, skip_special_tokens_);
  // Where the held tokens changed the text already given (a character's bytes, then
  // bytes that never make one: decode turns the whole run into U+FFFD), they alone.
  std::string out = text.starts_with(prefix_) ? text.substr(std::min(prefix_.size(), text.size()))
                                              : tokenizer_->decode(held(), skip_special_tokens_);
  ids_.clear();
  prefix_.clear();
  prefix_index_ = 0;
  return out;
}

}  // namespace torchattn::models

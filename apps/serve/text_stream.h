#pragma once

// A request's generated tokens as the text a client sees: whole UTF-8 characters as
// they arrive, no text for the stop tokens, and the API's stop sequences: the text
// ends before the first one, and nothing that could still become one is shown before
// it is known not to (so streamed and whole texts are the same).

#include <torchattn/models/tokenizer.h>

#include <cstdint>
#include <string>
#include <vector>

namespace serve {

class TextStream {
 public:
  /// hidden: token ids whose text is never shown (the stop tokens: EOS, <|im_end|>).
  /// stop: the request's stop sequences (non-empty strings).
  /// context: the prompt's last token (the text given is what the tokens add after it).
  TextStream(const torchattn::models::Tokenizer& tokenizer, std::vector<int64_t> hidden, std::vector<std::string> stop,
             std::vector<int64_t> context = {});

  /// The text that can be shown now that `token` came (often all of its text; "" while
  /// a character or a possible stop sequence is incomplete, or after a stop sequence).
  std::string push(int64_t token);

  /// At the end: the text held back, unless a stop sequence came.
  std::string finish();

  /// A stop sequence came: the text ended before it and the request should end.
  bool stopped() const { return stopped_; }

  /// Every piece of text returned so far, in order.
  const std::string& text() const { return text_; }

 private:
  std::string take(std::string piece);

  torchattn::models::DecodeStream decoder_;
  std::vector<int64_t> hidden_;
  std::vector<std::string> stop_;
  std::string held_;  // complete characters not shown yet: they may begin a stop sequence
  std::string text_;
  bool stopped_ = false;
};

}  // namespace serve

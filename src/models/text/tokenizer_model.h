#pragma once

// What every kind of tokenizer (byte-level BPE, WordPiece) gives the public
// Tokenizer, which picks one from tokenizer.json's model type.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace torchattn::models::text {

class TokenizerModel {
 public:
  virtual ~TokenizerModel() = default;
  /// UTF-8 text -> ids, with the template's special tokens when add_special_tokens.
  virtual std::vector<int64_t> encode(std::string_view text, bool add_special_tokens) const = 0;
  /// ids -> text, as transformers' decode (skip_special_tokens leaves special tokens out).
  virtual std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const = 0;
  /// What one token adds to the text before it (decode of it alone, but for a
  /// SentencePiece token's space, which decode strips from a text's first token).
  virtual std::string token_text(int64_t id) const { return decode({id}, false); }
  /// The id of a token given as text, if it has one.
  virtual std::optional<int64_t> id_of(const std::string& token) const = 0;
  virtual int64_t vocab_size() const = 0;
  /// The template's special tokens before and after a text ([CLS] and [SEP] for BERT).
  virtual const std::vector<int64_t>& prefix_ids() const = 0;
  virtual const std::vector<int64_t>& suffix_ids() const = 0;
};

}  // namespace torchattn::models::text

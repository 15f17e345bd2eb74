#pragma once

// A Hugging Face `tokenizer.json`: byte-level BPE (GPT-2, SmolLM2, Qwen2) or WordPiece
// (BERT, MiniLM), as transformers' fast tokenizers encode and decode.
//
//   torchattn::models::Tokenizer tok("all-MiniLM-L6-v2/tokenizer.json");
//   std::vector<int64_t> ids = tok.encode("Hello, world!");  // [CLS] hello , world ! [SEP]
//   std::string text = tok.decode(ids, /*skip_special_tokens=*/true);

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace torchattn::models {

namespace detail {
class TokenizerModel;
}

class Tokenizer {
 public:
  /// Reads `path` (a tokenizer.json). Another kind (a SentencePiece Unigram, a
  /// normalizer or pre-tokenizer it does not read) is a c10::Error saying what it is.
  explicit Tokenizer(const std::string& path);

  /// The same from a tokenizer.json's text in memory; `name` is used in errors.
  static Tokenizer from_json(std::string_view json_text, const std::string& name = "<memory>");

  /// Token ids of `text` (UTF-8), as transformers' `tokenizer(text)["input_ids"]`;
  /// add_special_tokens: the template's ([CLS] ... [SEP] for BERT; none for SmolLM2).
  /// max_length: at most this many ids, special tokens included: the text's tokens
  /// are cut at the end, as `tokenizer(text, truncation=True, max_length=n)`.
  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens = true,
                              std::optional<int64_t> max_length = std::nullopt) const;

  /// Text of `ids`, as transformers' `tokenizer.decode(ids, skip_special_tokens)`.
  /// For byte-level BPE, the tokens' bytes, which may end inside a UTF-8 character.
  /// An id outside the vocabulary is an error naming it.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const;

  /// The id of a token given as text ("<|im_end|>", "[PAD]"), if it has one.
  std::optional<int64_t> id_of(const std::string& token) const;

  /// Ids run from 0 to vocab_size() - 1.
  int64_t vocab_size() const;

  /// "BPE" or "WordPiece".
  const std::string& kind() const { return kind_; }

 private:
  Tokenizer() = default;
  void init(const void* parsed_json, const std::string& name);
  std::shared_ptr<const detail::TokenizerModel> model_;
  std::string kind_;
};

} // namespace torchattn::models

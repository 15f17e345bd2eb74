#pragma once

// A byte-level BPE tokenizer read from a Hugging Face `tokenizer.json`, of the kind
// GPT-2, SmolLM2 and Qwen2 use: added (special) tokens matched first, an optional
// NFC normalizer, a regex split (GPT-2's or Qwen2's) and digit splitting, bytes
// mapped to GPT-2's printable characters, BPE merges by rank, and a template that
// may add special tokens. Encodes and decodes as transformers' tokenizer does.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "models/text/pretokenize.h"
#include "models/text/tokenizer_model.h"
#include "models/text/vocabulary.h"
#include "models/text/word_cache.h"


namespace torchattn::models::text {

class BpeTokenizer final : public TokenizerModel {
 public:
  /// From a parsed tokenizer.json whose model is BPE. A variant it does not read (a
  /// SentencePiece-style byte fallback, a normalizer or pre-tokenizer it does not
  /// know) is a c10::Error that says what it is.
  explicit BpeTokenizer(const nlohmann::json& tokenizer);

  /// As transformers' `tokenizer(text)["input_ids"]`.
  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens) const override;

  /// The bytes of the tokens, as transformers' `tokenizer.decode(ids)`. May end
  /// inside a UTF-8 sequence.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const override;

  std::optional<int64_t> id_of(const std::string& token) const override;

  int64_t vocab_size() const override { return vocab_.size(); }
  const std::vector<int64_t>& prefix_ids() const override { return prefix_ids_; }
  const std::vector<int64_t>& suffix_ids() const override { return suffix_ids_; }

 private:
  std::vector<int64_t> encode_plain(std::string_view text) const;
  void bpe(const std::string& word, std::vector<int64_t>& out) const;

  Vocabulary vocab_;
  std::unordered_map<std::string, int> ranks_;  // "left right" -> merge rank
  bool nfc_ = false;
  bool split_digits_ = false;
  std::optional<SplitPattern> pattern_;
  bool add_prefix_space_ = false;
  bool ignore_merges_ = false;
  std::vector<int64_t> prefix_ids_, suffix_ids_;  // TemplateProcessing's special tokens around the text

  // Words of at most 64 bytes (a regex split's pieces: almost all), 65536 of them; it grew
  // without bound before, a new entry for each new word a server's clients sent.
  WordCache cache_{64, 1 << 16};
};

}  // namespace torchattn::models::text

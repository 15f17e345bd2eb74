#pragma once

// A BPE over SentencePiece's pieces, read from a Hugging Face `tokenizer.json`, of the
// kind Llama 2, Mistral and TinyLlama use (and transformers builds from a GGUF file's
// "llama" vocabulary): spaces written as U+2581 "▁", a "▁" put before the text, the
// text merged as one word (or split before each "▁"), a character outside the
// vocabulary as its bytes' <0xXX> tokens, and a decoder that undoes all of it. Encodes
// and decodes as transformers' tokenizer does.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "models/text/tokenizer_model.h"
#include "models/text/vocabulary.h"
#include "models/text/word_cache.h"

namespace torchattn::models::text {

class SentencePieceBpe final : public TokenizerModel {
 public:
  /// From a parsed tokenizer.json whose model is a BPE with byte_fallback. What it does
  /// not read (another normalizer, pre-tokenizer or decoder; a merge of pieces not in
  /// the vocabulary) is a c10::Error that says what it is.
  explicit SentencePieceBpe(const nlohmann::json& tokenizer);

  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens) const override;

  /// As transformers' decode: "▁" as a space, runs of <0xXX> tokens as their bytes (a
  /// run that is not UTF-8 as one U+FFFD a byte), the tokens joined, then the leading
  /// spaces the decoder strips.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const override;

  /// "▁" as a space, kept first; a <0xXX> token as its byte.
  std::string token_text(int64_t id) const override;

  std::optional<int64_t> id_of(const std::string& token) const override { return vocab_.id_of(token); }
  int64_t vocab_size() const override { return vocab_.size(); }
  const std::vector<int64_t>& prefix_ids() const override { return prefix_ids_; }
  const std::vector<int64_t>& suffix_ids() const override { return suffix_ids_; }

 private:
  enum class Prepend { Always, First, Never };
  struct Merge {
    int32_t rank;
    int32_t id;  // the merged piece
  };

  // One stretch of text between added tokens; `at_start`: it begins the text.
  void encode_plain(std::string_view text, bool at_start, std::vector<int64_t>& out) const;
  // The ids of one word (already in "▁" form), as tokenizers' BPE merges it.
  void merge_word(const std::string& word, std::vector<int64_t>& out) const;
  std::optional<Merge> merge_of(int64_t left, int64_t right) const;

  Vocabulary vocab_;
  std::unordered_map<uint64_t, Merge> merges_;    // (left id << 32 | right id) -> merge
  std::vector<std::optional<int64_t>> byte_ids_;  // <0xXX>'s id, per byte
  std::optional<int64_t> unk_;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  // The text's way to "▁" form: a normalizer (Prepend, Replace), or a Metaspace
  // pre-tokenizer (Replace, then Prepend by its scheme, and Split before each "▁").
  bool normalizer_prepend_ = false;
  bool replace_spaces_ = false;
  Prepend prepend_ = Prepend::Never;
  bool split_ = false;
  // The decoder: "▁" -> " ", <0xXX> -> bytes (a tokenizer.json's decoder must say both),
  // then up to strip_start_ leading spaces off.
  int64_t strip_start_ = 0;
  std::vector<int64_t> prefix_ids_, suffix_ids_;

  // Words up to 64 bytes, 65536 of them: a long prompt (one word when split_ is off) is
  // never held.
  WordCache cache_{64, 1 << 16};
};

}  // namespace torchattn::models::text

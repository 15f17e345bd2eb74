#pragma once

// A WordPiece tokenizer read from a Hugging Face `tokenizer.json`, of the kind BERT
// and MiniLM use: added (special) tokens matched first; BertNormalizer (control
// characters removed, whitespace made spaces, spaces around CJK ideographs, accents
// stripped, lowercase); BertPreTokenizer (split on whitespace, each punctuation
// character a word); greedy longest-match WordPiece with the "##" prefix; the
// [CLS] text [SEP] template. Encodes as transformers' BertTokenizerFast does.

#include "models/text/tokenizer_model.h"
#include "models/text/vocabulary.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace torchattn::models::text {

class WordPieceTokenizer final : public TokenizerModel {
 public:
  /// From a parsed tokenizer.json whose model is WordPiece. Options it does not read
  /// are a c10::Error that says what they are.
  explicit WordPieceTokenizer(const nlohmann::json& tokenizer);

  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens) const override;
  /// As the WordPiece decoder: "##" pieces join the word before, others are
  /// separated by spaces, then the decoder's cleanup (" ." -> ".", " n't" -> "n't", ...).
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const override;
  std::optional<int64_t> id_of(const std::string& token) const override;
  int64_t vocab_size() const override { return vocab_.size(); }
  const std::vector<int64_t>& prefix_ids() const override { return prefix_ids_; }
  const std::vector<int64_t>& suffix_ids() const override { return suffix_ids_; }

 private:
  std::u32string normalize(std::u32string_view text) const;
  void encode_plain(std::string_view text, std::vector<int64_t>& out) const;
  void word_pieces(const std::u32string& word, std::vector<int64_t>& out) const;

  Vocabulary vocab_;
  int64_t unk_id_ = 0;
  std::string prefix_ = "##";
  size_t max_chars_ = 100;
  bool clean_text_ = true, chinese_ = true, strip_accents_ = true, lowercase_ = true, normalizer_ = true;
  bool cleanup_ = true;
  std::vector<int64_t> prefix_ids_, suffix_ids_;
};

}  // namespace torchattn::models::text

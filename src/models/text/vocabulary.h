#pragma once

// What the tokenizer.json of every kind holds alike: the model's vocabulary, the added
// (special) tokens matched in the raw text before anything else, and the template's
// special tokens around a text. BpeTokenizer and WordPieceTokenizer build on it.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchattn::models::text {

/// j[key] when j is an object holding it and it is not null, else `fallback`.
template <typename T>
T get_or(const nlohmann::json& j, const char* key, T fallback) {
  if (!j.is_object()) return fallback;
  const auto it = j.find(key);
  return it == j.end() || it->is_null() ? fallback : it->get<T>();
}

/// j[key] when j is an object holding it, else null. (A const json's operator[] with a
/// missing key is undefined behaviour.)
inline const nlohmann::json& field(const nlohmann::json& j, const char* key) {
  static const nlohmann::json null_value;
  if (!j.is_object()) return null_value;
  const auto it = j.find(key);
  return it == j.end() ? null_value : *it;
}

class Vocabulary {
 public:
  /// From a parsed tokenizer.json: model.vocab (token -> id) and added_tokens. An id
  /// outside [0, 2^26) is an error naming the token; `kind` ("BPE", "WordPiece") is
  /// used in errors about added tokens it cannot read (normalized ones, or lstrip,
  /// rstrip and single_word).
  Vocabulary(const nlohmann::json& tokenizer, const std::string& kind);

  /// The id of a piece of the model's vocabulary.
  std::optional<int64_t> piece(const std::string& text) const;
  /// The id of a token given as text: an added token's content, else a piece.
  std::optional<int64_t> id_of(const std::string& token) const;

  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  /// The token's text (a piece, or an added token's content); an id outside the
  /// vocabulary is an error naming it.
  const std::string& token(int64_t id) const;
  bool is_added(int64_t id) const { return is_added_[static_cast<size_t>(id)]; }
  bool is_special(int64_t id) const { return is_special_[static_cast<size_t>(id)]; }

  /// Walks `text` left to right: `plain` gets each stretch between added tokens (never
  /// empty), `added` each added token's id (the longest one matching there).
  void split_added(std::string_view text, const std::function<void(std::string_view)>& plain,
                   const std::function<void(int64_t)>& added) const;

 private:
  struct Added {
    std::string content;
    int64_t id;
  };
  std::unordered_map<std::string, int64_t> pieces_;
  std::vector<std::string> tokens_;  // id -> text
  std::vector<bool> is_added_, is_special_;
  std::vector<Added> added_;  // longest first
};

/// A merge of model.merges, ["a", "b"] or "a b", as its two pieces; a string without a
/// space is an error naming it.
std::pair<std::string, std::string> merge_pieces(const nlohmann::json& merge);

/// The post-processor's steps: a Sequence's processors, or the one step (none if null).
std::vector<nlohmann::json> post_processor_steps(const nlohmann::json& tokenizer);

/// A TemplateProcessing post-processor's special tokens for a single text: those before
/// the text into `prefix`, those after into `suffix`.
void template_ids(const nlohmann::json& post, std::vector<int64_t>& prefix, std::vector<int64_t>& suffix);

}  // namespace torchattn::models::text

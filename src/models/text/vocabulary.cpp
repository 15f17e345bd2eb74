#include "models/text/vocabulary.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace torchattn::models::text {

namespace {

using json = nlohmann::json;

// A token's id from the file: an integer in [0, 2^26) (a bound far above any
// vocabulary, so that a damaged file cannot ask for a huge table).
int64_t token_id(const json& id, const std::string& token) {
  TORCH_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < (int64_t{1} << 26),
              "tokenizer: the id of token '", token, "' is ", id.dump(), "; expected an integer in [0, 2^26)");
  return id.get<int64_t>();
}

}  // namespace

Vocabulary::Vocabulary(const json& t, const std::string& kind) {
  const json& vocab = t.at("model").at("vocab");
  const json added = get_or<json>(t, "added_tokens", json::array());
  int64_t max_id = -1;
  for (const auto& [text, id] : vocab.items()) max_id = std::max(max_id, token_id(id, text));
  for (const auto& a : added) max_id = std::max(max_id, token_id(a.at("id"), a.at("content").get<std::string>()));
  tokens_.resize(static_cast<size_t>(max_id + 1));
  is_added_.assign(tokens_.size(), false);
  is_special_.assign(tokens_.size(), false);
  for (const auto& [text, id] : vocab.items()) {
    pieces_[text] = id.get<int64_t>();
    tokens_[static_cast<size_t>(id.get<int64_t>())] = text;
  }
  for (const auto& a : added) {
    const std::string content = a.at("content").get<std::string>();
    const int64_t id = a.at("id").get<int64_t>();
    const bool special = get_or<bool>(a, "special", false);
    TORCH_CHECK(!get_or<bool>(a, "normalized", false) || special, "tokenizer: the added token '", content,
                "' is normalized; this library reads ", kind, " tokenizers whose added tokens match the raw text");
    TORCH_CHECK(!get_or<bool>(a, "lstrip", false) && !get_or<bool>(a, "rstrip", false) &&
                    !get_or<bool>(a, "single_word", false),
                "tokenizer: the added token '", content, "' has lstrip, rstrip or single_word, which this library's ",
                kind, " tokenizer does not read");
    added_.push_back({content, id});
    tokens_[static_cast<size_t>(id)] = content;
    is_added_[static_cast<size_t>(id)] = true;
    is_special_[static_cast<size_t>(id)] = special;
  }
  std::stable_sort(added_.begin(), added_.end(),
                   [](const Added& x, const Added& y) { return x.content.size() > y.content.size(); });
}

std::optional<int64_t> Vocabulary::piece(const std::string& text) const {
  const auto it = pieces_.find(text);
  return it == pieces_.end() ? std::nullopt : std::optional<int64_t>(it->second);
}

std::optional<int64_t> Vocabulary::id_of(const std::string& token) const {
  for (const auto& a : added_) {
    if (a.content == token) return a.id;
  }
  return piece(token);
}

const std::string& Vocabulary::token(int64_t id) const {
  TORCH_CHECK(id >= 0 && id < size(), "tokenizer: no token has id ", id, " (vocabulary of ", size(), ")");
  return tokens_[static_cast<size_t>(id)];
}

void Vocabulary::split_added(std::string_view text, const std::function<void(std::string_view)>& plain,
                             const std::function<void(int64_t)>& added) const {
  size_t start = 0;
  for (size_t i = 0; i < text.size() && !added_.empty();) {
    const Added* hit = nullptr;
    for (const auto& a : added_) {
      if (!a.content.empty() && text.compare(i, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    if (i > start) plain(text.substr(start, i - start));
    added(hit->id);
    i += hit->content.size();
    start = i;
  }
  if (start < text.size()) plain(text.substr(start));
}

std::pair<std::string, std::string> merge_pieces(const json& merge) {
  if (merge.is_array()) return {merge.at(0).get<std::string>(), merge.at(1).get<std::string>()};
  const std::string s = merge.get<std::string>();
  const auto space = s.find(' ');
  TORCH_CHECK(space != std::string::npos, "tokenizer: the merge '", s, "' is not two pieces separated by a space");
  return {s.substr(0, space), s.substr(space + 1)};
}

std::vector<json> post_processor_steps(const json& t) {
  const json& post = field(t, "post_processor");
  std::vector<json> steps;
  if (post.is_object() && get_or<std::string>(post, "type", "") == "Sequence") {
    for (const auto& p : post.at("processors")) steps.push_back(p);
  } else if (!post.is_null()) {
    steps.push_back(post);
  }
  return steps;
}

void template_ids(const json& post, std::vector<int64_t>& prefix, std::vector<int64_t>& suffix) {
  bool after = false;
  for (const auto& piece : post.at("single")) {
    if (piece.contains("Sequence")) {
      after = true;
      continue;
    }
    const std::string name = piece.at("SpecialToken").at("id").get<std::string>();
    for (const auto& id : post.at("special_tokens").at(name).at("ids")) {
      (after ? suffix : prefix).push_back(id.get<int64_t>());
    }
  }
}

}  // namespace torchattn::models::text

#include <torchattn/models/tokenizer.h>

#include "models/text/bpe_tokenizer.h"
#include "models/files/json_file.h"
#include "models/text/utf8_check.h"
#include "models/text/sentencepiece_bpe.h"
#include "models/text/wordpiece_tokenizer.h"

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

namespace torchattn::models {

std::optional<size_t> find_invalid_utf8(std::string_view text) { return text::first_invalid_utf8(text); }

Tokenizer::Tokenizer(const std::string& path) {
  const auto t = files::read_json_file(path, "tokenizer");
  init(&t, path);
}

Tokenizer Tokenizer::from_json(std::string_view json_text, const std::string& name) {
  const auto t = nlohmann::json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
  TORCH_CHECK(!t.is_discarded(), "tokenizer: '", name, "' is not valid JSON");
  Tokenizer tok;
  tok.init(&t, name);
  return tok;
}

void Tokenizer::init(const void* parsed, const std::string& name) {
  const auto& t = *static_cast<const nlohmann::json*>(parsed);
  TORCH_CHECK(t.is_object() && t.contains("model") && t["model"].is_object(), "tokenizer: '", name,
              "' has no model object");
  const auto& type = t["model"].contains("type") ? t["model"]["type"] : nlohmann::json();
  kind_ = type.is_string() ? type.get<std::string>() : "?";
  try {
    if (kind_ == "BPE" && text::get_or<bool>(t["model"], "byte_fallback", false)) {
      model_ = std::make_shared<text::SentencePieceBpe>(t);
    } else if (kind_ == "BPE") {
      model_ = std::make_shared<text::BpeTokenizer>(t);
    } else if (kind_ == "WordPiece") {
      model_ = std::make_shared<text::WordPieceTokenizer>(t);
    } else {
      TORCH_CHECK(false, "tokenizer: '", name, "' is a ", kind_,
                  " tokenizer; this library reads BPE (GPT-2, SmolLM2, "
                  "Qwen2; Llama 2, Mistral) and WordPiece (BERT) tokenizers");
    }
  } catch (const nlohmann::json::exception& e) {
    // A field of the wrong type or missing, as the JSON library words it.
    TORCH_CHECK(false, "tokenizer: '", name, "' is not a tokenizer.json this library reads: ", e.what());
  }
  const int64_t n = model_->vocab_size();
  for (const auto& ids : {model_->prefix_ids(), model_->suffix_ids()}) {
    for (const int64_t id : ids) {
      TORCH_CHECK(id >= 0 && id < n, "tokenizer: '", name, "': the template's special token id ", id,
                  " is outside the vocabulary of ", n);
    }
  }
}

std::vector<int64_t> Tokenizer::encode(std::string_view text, bool add_special_tokens,
                                       std::optional<int64_t> max_length) const {
  text::check_utf8("Tokenizer::encode", text);
  if (!max_length) return model_->encode(text, add_special_tokens);
  const auto& prefix = model_->prefix_ids();
  const auto& suffix = model_->suffix_ids();
  const int64_t specials = add_special_tokens ? static_cast<int64_t>(prefix.size() + suffix.size()) : 0;
  TORCH_CHECK(*max_length > specials, "Tokenizer::encode: expected max_length > ", specials,
              " (the special tokens it adds), got ", *max_length);
  std::vector<int64_t> ids = model_->encode(text, /*add_special_tokens=*/false);
  if (static_cast<int64_t>(ids.size()) > *max_length - specials)
    ids.resize(static_cast<size_t>(*max_length - specials));
  if (!add_special_tokens) return ids;
  std::vector<int64_t> out = prefix;
  out.insert(out.end(), ids.begin(), ids.end());
  out.insert(out.end(), suffix.begin(), suffix.end());
  return out;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  return model_->decode(ids, skip_special_tokens);
}

std::string Tokenizer::token_text(int64_t id) const { return model_->token_text(id); }

std::optional<int64_t> Tokenizer::id_of(const std::string& token) const { return model_->id_of(token); }

int64_t Tokenizer::vocab_size() const { return model_->vocab_size(); }

const std::vector<int64_t>& Tokenizer::prefix_ids() const { return model_->prefix_ids(); }

const std::vector<int64_t>& Tokenizer::suffix_ids() const { return model_->suffix_ids(); }

}  // namespace torchattn::models

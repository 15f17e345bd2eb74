#include <torchattn/models/folder_checks.h>

#include <torchattn/models/chat.h>

#include "models/files/json_file.h"

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <vector>

namespace torchattn::models {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string file_of(const std::string& folder, const char* name) { return (fs::path(folder) / name).string(); }

void check_kind(const std::string& folder, const Tokenizer& tokenizer, const std::string& model_type,
                const std::string& expected_kind, const char* expected_words) {
  TORCH_CHECK(tokenizer.kind() == expected_kind, "tokenizer: '", file_of(folder, "tokenizer.json"), "' is a ",
              tokenizer.kind(), " tokenizer; '", file_of(folder, "config.json"), "' holds a ", model_type,
              " model, which expects ", expected_words, " (is the tokenizer.json another model's?)");
}

void check_fits(const std::string& folder, const Tokenizer& tokenizer, int64_t vocab_size) {
  TORCH_CHECK(tokenizer.vocab_size() <= vocab_size, "tokenizer: '", file_of(folder, "tokenizer.json"),
              "' gives ids up to ", tokenizer.vocab_size() - 1, " (", tokenizer.vocab_size(), " tokens); '",
              file_of(folder, "config.json"), "' has vocab_size ", vocab_size, ", so expected every id below ",
              vocab_size, " (is the tokenizer.json another model's?)");
}

// The bos, eos and pad token ids `file` gives (a number, a list of them, or null): each an
// id of the tokenizer.
void check_special_ids(const std::string& folder, const json& j, const std::string& file, const Tokenizer& tokenizer) {
  if (!j.is_object()) return;
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    const json list = it->is_array() ? *it : json::array({*it});
    for (const json& id : list) {
      TORCH_CHECK(id.is_number_integer(), "config: '", file, "': expected ", key,
                  " to be a token id or a list of them, got ", it->dump());
      const int64_t v = id.get<int64_t>();
      TORCH_CHECK(v >= 0 && v < tokenizer.vocab_size(), "tokenizer: '", file, "' has ", key, " ", v,
                  ", expected an id of '", file_of(folder, "tokenizer.json"), "' (0 to ", tokenizer.vocab_size() - 1,
                  "): is the tokenizer.json another model's?");
    }
  }
}

// config.json's ids, and generation_config.json's where the folder has one.
void check_config_ids(const std::string& folder, const Tokenizer& tokenizer) {
  for (const char* name : {"config.json", "generation_config.json"}) {
    const std::string file = file_of(folder, name);
    if (!fs::exists(file)) continue;
    check_special_ids(folder, files::read_json_file(file, "config"), file, tokenizer);
  }
}

}  // namespace

void check_tokenizer(const std::string& folder, const DecoderConfig& config, const Tokenizer& tokenizer) {
  check_kind(folder, tokenizer, config.model_type, "BPE",
             "a BPE tokenizer (byte-level: GPT-2, SmolLM2, Qwen2; SentencePiece: Llama 2, Mistral)");
  check_fits(folder, tokenizer, config.vocab_size);
  check_config_ids(folder, tokenizer);
  // The chat template's turns are tokenized as its special tokens, and generation stops at
  // <|im_end|>: without them, chat prompts are plain text and the answer never ends.
  const auto chat_template = read_chat_template(folder);
  if (chat_template && chat_template->find("<|im_start|>") != std::string::npos) {
    const std::string jinja = file_of(folder, "chat_template.jinja");
    const std::string source = fs::exists(jinja) ? jinja : file_of(folder, "tokenizer_config.json");
    for (const char* token : {"<|im_start|>", "<|im_end|>"}) {
      TORCH_CHECK(tokenizer.id_of(token).has_value(), "tokenizer: the chat template of '", source, "' uses ", token,
                  ", expected a token of '", file_of(folder, "tokenizer.json"),
                  "', got none of that name (is the "
                  "tokenizer.json another model's?)");
    }
  }
}

void check_tokenizer(const std::string& folder, const BertConfig& config, const Tokenizer& tokenizer) {
  check_kind(folder, tokenizer, "bert", "WordPiece", "a WordPiece tokenizer (BERT's kind)");
  check_fits(folder, tokenizer, config.vocab_size);
  std::string missing;
  for (const char* token : {"[CLS]", "[SEP]", "[UNK]"}) {
    if (!tokenizer.id_of(token)) missing += std::string(missing.empty() ? "" : ", ") + token;
  }
  TORCH_CHECK(missing.empty(), "tokenizer: '", file_of(folder, "tokenizer.json"),
              "' lacks tokens a BERT encoder reads: expected [CLS], [SEP] and [UNK], got none for ", missing);
  if (!tokenizer.id_of("[PAD]")) {
    TORCH_CHECK(config.pad_token_id >= 0 && config.pad_token_id < tokenizer.vocab_size(), "tokenizer: '",
                file_of(folder, "tokenizer.json"), "' has no [PAD] token and '", file_of(folder, "config.json"),
                "' has pad_token_id ", config.pad_token_id, ", expected an id of the tokenizer (0 to ",
                tokenizer.vocab_size() - 1, ")");
  }
  check_config_ids(folder, tokenizer);
}

}  // namespace torchattn::models

// Tokenizer::from_gguf: a GGUF file's tokenizer (tokenizer.ggml.*) written as the
// tokenizer.json that transformers' GGUF loader makes of it, then read as any other.

#include <torchattn/gguf.h>
#include <torchattn/models/tokenizer.h>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace torchattn::models {

namespace {

using json = nlohmann::json;  // a std::map: 150k tokens looked up in log time

// GGUF's token types (llama.cpp's llama_token_type): 3 control, 4 user-defined.
constexpr int64_t kControl = 3, kUserDefined = 4;

json byte_level(bool add_prefix_space) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", add_prefix_space}, {"trim_offsets", true}, {"use_regex", true}};
}

// The pre-tokenizer of tokenizer.ggml.pre, as transformers' tokenizer.json writes it.
json pre_tokenizer(const std::string& pre, const std::string& name) {
  if (pre == "smollm" || pre == "gpt2" || pre == "default") return byte_level(false);
  if (pre == "qwen2") {
    const std::string regex =
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
        "\\s+(?!\\S)|\\s+";
    json split = {{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}};
    json level = byte_level(false);
    level["use_regex"] = false;
    return {{"type", "Sequence"}, {"pretokenizers", json::array({split, level})}};
  }
  TORCH_CHECK(false, "tokenizer: '", name, "': tokenizer.ggml.pre '", pre,
              "' is a pre-tokenizer torchattn does not read (smollm, gpt2, default, qwen2)");
}

}  // namespace

Tokenizer Tokenizer::from_gguf(const torchattn::GgufFile& file, const std::string& name) {
  const std::string& model = file.string("tokenizer.ggml.model");
  TORCH_CHECK(model == "gpt2", "tokenizer: '", name, "': tokenizer.ggml.model is '", model,
              "'; torchattn reads byte-level BPE tokenizers (gpt2) from GGUF files",
              model == "llama" ? ", not SentencePiece ones (llama): load the Hugging Face folder" : "");
  const std::vector<std::string> tokens = file.strings("tokenizer.ggml.tokens");
  const std::vector<std::string> merges = file.has("tokenizer.ggml.merges") ? file.strings("tokenizer.ggml.merges")
                                                                            : std::vector<std::string>();
  const std::vector<int64_t> types = file.has("tokenizer.ggml.token_type") ? file.integers("tokenizer.ggml.token_type")
                                                                           : std::vector<int64_t>();
  TORCH_CHECK(types.empty() || types.size() == tokens.size(), "tokenizer: '", name, "': tokenizer.ggml.token_type has ",
              types.size(), " entries for ", tokens.size(), " tokens");
  json vocab = json::object();
  json added = json::array();
  for (size_t i = 0; i < tokens.size(); ++i) {
    TORCH_CHECK(!vocab.contains(tokens[i]), "tokenizer: '", name, "': token '", tokens[i], "' appears twice (ids ",
                vocab[tokens[i]].get<int64_t>(), " and ", i, ")");
    vocab[tokens[i]] = static_cast<int64_t>(i);
    const int64_t type = types.empty() ? 1 : types[i];
    if (type == kControl || type == kUserDefined) {
      added.push_back({{"id", static_cast<int64_t>(i)},
                       {"content", tokens[i]},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", type == kControl}});
    }
  }
  json pairs = json::array();
  for (const auto& m : merges) {
    const size_t space = m.find(' ');
    TORCH_CHECK(space != std::string::npos && space > 0 && space + 1 < m.size(), "tokenizer: '", name, "': the merge '",
                m, "' is not two tokens separated by a space");
    pairs.push_back({m.substr(0, space), m.substr(space + 1)});
  }
  json single = json::array({{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}});
  json special = json::object();
  const bool add_bos = file.has("tokenizer.ggml.add_bos_token") && file.boolean("tokenizer.ggml.add_bos_token");
  if (add_bos) {
    const int64_t bos = file.integer("tokenizer.ggml.bos_token_id");
    TORCH_CHECK(bos >= 0 && bos < static_cast<int64_t>(tokens.size()), "tokenizer: '", name,
                "': tokenizer.ggml.bos_token_id ", bos, " is outside the vocabulary of ", tokens.size());
    const std::string& text = tokens[static_cast<size_t>(bos)];
    single = json::array({{{"SpecialToken", {{"id", text}, {"type_id", 0}}}}, single[0]});
    special[text] = {{"id", text}, {"ids", json::array({bos})}, {"tokens", json::array({text})}};
  }
  const json t = {{"version", "1.0"},
                  {"truncation", nullptr},
                  {"padding", nullptr},
                  {"added_tokens", added},
                  {"normalizer", nullptr},
                  {"pre_tokenizer", pre_tokenizer(file.has("tokenizer.ggml.pre") ? file.string("tokenizer.ggml.pre")
                                                                                 : std::string("default"),
                                                  name)},
                  {"post_processor", {{"type", "TemplateProcessing"}, {"single", single}, {"special_tokens", special}}},
                  {"decoder", byte_level(true)},
                  {"model",
                   {{"type", "BPE"},
                    {"dropout", nullptr},
                    {"unk_token", nullptr},
                    {"continuing_subword_prefix", ""},
                    {"end_of_word_suffix", ""},
                    {"fuse_unk", false},
                    {"byte_fallback", false},
                    {"ignore_merges", false},
                    {"vocab", vocab},
                    {"merges", pairs}}}};
  return from_json(t.dump(), name);
}

}  // namespace torchattn::models

// Tokenizer::from_gguf: a GGUF file's tokenizer (tokenizer.ggml.*) written as the
// tokenizer.json that transformers' GGUF loader makes of it, then read as any other:
// byte-level BPE (gpt2) or SentencePiece BPE (llama).

#include <torchattn/gguf.h>
#include <torchattn/models/tokenizer.h>

#include "models/text/utf8_check.h"

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
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

// The strings of `key` (tokens, merges), each checked to be UTF-8: a tokenizer.json holds
// only text.
std::vector<std::string> utf8_strings(const torchattn::GgufFile& file, const std::string& key,
                                      const std::string& name) {
  std::vector<std::string> out = file.strings(key);
  for (size_t i = 0; i < out.size(); ++i) {
    const auto bad = text::first_invalid_utf8(out[i]);
    TORCH_CHECK(!bad.has_value(), "tokenizer: '", name, "': ", key, "[", i, "] is not UTF-8 (the byte at offset ",
                bad.value_or(0), ")");
  }
  return out;
}

// The code points of a UTF-8 string, each as its bytes.
std::vector<std::string> characters(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const auto lead = static_cast<unsigned char>(s[i]);
    const size_t n = std::min<size_t>(lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1, s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

// The merges a SentencePiece vocabulary implies, as transformers' generate_merges
// derives them from the scores: every split of a piece into two pieces of the
// vocabulary, in the order of (score, left's length, right's length), highest first,
// ties in the vocabulary's order (the left's id, then the right's, within a piece).
json merges_from_scores(const std::vector<std::string>& tokens, const std::vector<double>& scores,
                        const std::unordered_map<std::string, int64_t>& ids) {
  struct Split {
    double score;
    int64_t left_length, right_length;  // in code points
    std::string left, right;
  };
  std::vector<Split> splits;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const auto chars = characters(tokens[t]);
    std::vector<Split> local;
    std::string left;
    for (size_t k = 1; k < chars.size(); ++k) {
      left += chars[k - 1];
      const std::string right = tokens[t].substr(left.size());
      if (ids.count(left) > 0 && ids.count(right) > 0) {
        local.push_back({scores[t], static_cast<int64_t>(k), static_cast<int64_t>(chars.size() - k), left, right});
      }
    }
    std::stable_sort(local.begin(), local.end(), [&](const Split& a, const Split& b) {
      return std::pair(ids.at(a.left), ids.at(a.right)) < std::pair(ids.at(b.left), ids.at(b.right));
    });
    for (auto& s : local) splits.push_back(std::move(s));
  }
  std::stable_sort(splits.begin(), splits.end(), [](const Split& a, const Split& b) {
    return std::tuple(a.score, a.left_length, a.right_length) > std::tuple(b.score, b.left_length, b.right_length);
  });
  json merges = json::array();
  for (const auto& s : splits) merges.push_back({s.left, s.right});
  return merges;
}

// A token id the file gives under `key`, checked against the vocabulary.
std::optional<int64_t> token_id(const torchattn::GgufFile& file, const std::string& key, size_t vocabulary,
                                const std::string& name) {
  if (!file.has(key)) return std::nullopt;
  const int64_t id = file.integer(key);
  TORCH_CHECK(id >= 0 && id < static_cast<int64_t>(vocabulary), "tokenizer: '", name, "': ", key, " ", id,
              " is outside the vocabulary of ", vocabulary);
  return id;
}

// tokenizer.ggml.model "llama" as transformers' GGUF loader builds it (a LlamaTokenizer
// of the file's pieces and the merges their scores imply: a BPE with byte fallback;
// control, unknown, BOS and EOS tokens special, user-defined ones added; BOS first unless
// add_bos_token says otherwise, llama.cpp's default for this model; EOS last where
// add_eos_token says so) but with the normalizer of Llama 2's and Mistral's own
// tokenizer.json: a "▁" before every stretch of text between added tokens, as
// sentencepiece and llama.cpp encode. (transformers' Metaspace puts none before a text
// that begins with a space, nor after a special token: "<s>[INST]" would not be how
// those models saw it in training.)
json sentencepiece_json(const torchattn::GgufFile& file, const std::string& name) {
  const std::vector<std::string> tokens = utf8_strings(file, "tokenizer.ggml.tokens", name);
  TORCH_CHECK(file.has("tokenizer.ggml.scores"), "tokenizer: '", name,
              "': a SentencePiece vocabulary (tokenizer.ggml.model 'llama') needs tokenizer.ggml.scores");
  const std::vector<double> scores = file.numbers("tokenizer.ggml.scores");
  TORCH_CHECK(scores.size() == tokens.size(), "tokenizer: '", name, "': tokenizer.ggml.scores has ", scores.size(),
              " entries for ", tokens.size(), " tokens");
  const std::vector<int64_t> types = file.has("tokenizer.ggml.token_type") ? file.integers("tokenizer.ggml.token_type")
                                                                           : std::vector<int64_t>();
  TORCH_CHECK(types.empty() || types.size() == tokens.size(), "tokenizer: '", name, "': tokenizer.ggml.token_type has ",
              types.size(), " entries for ", tokens.size(), " tokens");
  std::unordered_map<std::string, int64_t> ids;
  json vocab = json::object();
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto [it, fresh] = ids.emplace(tokens[i], static_cast<int64_t>(i));
    TORCH_CHECK(fresh, "tokenizer: '", name, "': token '", tokens[i], "' appears twice (ids ", it->second, " and ", i,
                ")");
    vocab[tokens[i]] = static_cast<int64_t>(i);
  }
  const auto bos = token_id(file, "tokenizer.ggml.bos_token_id", tokens.size(), name);
  const auto eos = token_id(file, "tokenizer.ggml.eos_token_id", tokens.size(), name);
  const auto unk = token_id(file, "tokenizer.ggml.unknown_token_id", tokens.size(), name);
  const auto pad = token_id(file, "tokenizer.ggml.padding_token_id", tokens.size(), name);
  json added = json::array();
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto id = static_cast<int64_t>(i);
    const int64_t type = types.empty() ? 1 : types[i];
    const bool special = type == kControl || id == bos || id == eos || id == unk || id == pad;
    if (special || type == kUserDefined) {
      added.push_back({{"id", id},
                       {"content", tokens[i]},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", special}});
    }
  }
  const bool add_bos = !file.has("tokenizer.ggml.add_bos_token") || file.boolean("tokenizer.ggml.add_bos_token");
  const bool add_eos = file.has("tokenizer.ggml.add_eos_token") && file.boolean("tokenizer.ggml.add_eos_token");
  json single = json::array({{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}});
  json special = json::object();
  const auto around = [&](bool wanted, const std::optional<int64_t>& id, const char* which, bool first) {
    if (!wanted) return;
    TORCH_CHECK(id.has_value(), "tokenizer: '", name, "': a SentencePiece vocabulary adds ", which,
                " (tokenizer.ggml.add_", which, "_token) and the file has no tokenizer.ggml.", which, "_token_id");
    const std::string& text = tokens[static_cast<size_t>(*id)];
    const json piece = {{"SpecialToken", {{"id", text}, {"type_id", 0}}}};
    single.insert(first ? single.begin() : single.end(), piece);
    special[text] = {{"id", text}, {"ids", json::array({*id})}, {"tokens", json::array({text})}};
  };
  around(add_bos, bos, "bos", true);
  around(add_eos, eos, "eos", false);
  // add_space_prefix false (llama.cpp's reading; transformers' loader ignores the key):
  // no "▁" before the text, none stripped from the decoded text.
  const bool prefix = !file.has("tokenizer.ggml.add_space_prefix") || file.boolean("tokenizer.ggml.add_space_prefix");
  const std::string space = "\xE2\x96\x81";
  json normalizers = json::array({{{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", space}}});
  json decoders = json::array({{{"type", "Replace"}, {"pattern", {{"String", space}}}, {"content", " "}},
                               {{"type", "ByteFallback"}},
                               {{"type", "Fuse"}}});
  if (prefix) {
    normalizers.insert(normalizers.begin(), json::object({{"type", "Prepend"}, {"prepend", space}}));
    decoders.push_back(json::object({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}));
  }
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", {{"type", "Sequence"}, {"normalizers", normalizers}}},
          {"pre_tokenizer", nullptr},
          {"post_processor", {{"type", "TemplateProcessing"}, {"single", single}, {"special_tokens", special}}},
          {"decoder", {{"type", "Sequence"}, {"decoders", decoders}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", true},
            {"byte_fallback", true},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", merges_from_scores(tokens, scores, ids)}}}};
}

}  // namespace

Tokenizer Tokenizer::from_gguf(const torchattn::GgufFile& file, const std::string& name) {
  const std::string& model = file.string("tokenizer.ggml.model");
  TORCH_CHECK(model == "gpt2" || model == "llama", "tokenizer: '", name, "': tokenizer.ggml.model is '", model,
              "'; torchattn reads byte-level BPE (gpt2) and SentencePiece BPE (llama) tokenizers from GGUF files");
  if (model == "llama") return from_json(sentencepiece_json(file, name).dump(), name);
  const std::vector<std::string> tokens = utf8_strings(file, "tokenizer.ggml.tokens", name);
  const std::vector<std::string> merges = file.has("tokenizer.ggml.merges")
                                              ? utf8_strings(file, "tokenizer.ggml.merges", name)
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

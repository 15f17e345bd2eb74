#pragma once

// A decoder as the apps take it (--model): a Hugging Face folder or a GGUF file. What an
// app reads before the weights load (the context's bound, a prompt's token count) comes
// from config.json and tokenizer.json, or from the GGUF file's metadata.

#include <torchattn/gguf.h>
#include <torchattn/models.h>

#include <CLI/CLI.hpp>

#include <filesystem>
#include <optional>
#include <string>

namespace apps {

/// A CLI11 check: an existing folder, or a GGUF file.
inline CLI::Validator folder_or_gguf() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        std::error_code ec;
        if (std::filesystem::is_directory(s, ec) || torchattn::models::is_gguf_file(s)) return {};
        if (!std::filesystem::exists(s, ec)) return "'" + s + "' does not exist";
        return "'" + s + "' is neither a model folder nor a GGUF file";
      },
      "DIR|FILE.gguf");
}

/// The decoder's config: config.json's, or the GGUF file's metadata.
inline torchattn::models::DecoderConfig decoder_config(const std::string& model) {
  if (torchattn::models::is_gguf_file(model)) {
    return torchattn::models::gguf_decoder_config(torchattn::GgufFile::open(model));
  }
  return torchattn::models::read_decoder_config((std::filesystem::path(model) / "config.json").string());
}

/// Where the model's positions come from, for messages.
inline std::string positions_source(const std::string& model) {
  return torchattn::models::is_gguf_file(model) ? "the GGUF file's context_length"
                                                : "config.json's max_position_embeddings";
}

/// The model's tokenizer: tokenizer.json's, or the GGUF file's.
inline torchattn::models::Tokenizer tokenizer_of(const std::string& model) {
  if (torchattn::models::is_gguf_file(model)) {
    return torchattn::models::Tokenizer::from_gguf(torchattn::GgufFile::open(model), model);
  }
  return torchattn::models::Tokenizer((std::filesystem::path(model) / "tokenizer.json").string());
}

/// The model's chat template, if it has one.
inline std::optional<std::string> chat_template_of(const std::string& model) {
  if (torchattn::models::is_gguf_file(model)) {
    const auto file = torchattn::GgufFile::open(model);
    if (!file.has("tokenizer.chat_template")) return std::nullopt;
    return file.string("tokenizer.chat_template");
  }
  return torchattn::models::read_chat_template(model);
}

}  // namespace apps

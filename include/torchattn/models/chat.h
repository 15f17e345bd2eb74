#pragma once

// The chat format of models whose template uses <|im_start|> (SmolLM2, Qwen2):
//   <|im_start|>system\n...<|im_end|>\n<|im_start|>user\n...<|im_end|>\n<|im_start|>assistant\n
// with the template's own default system message, read from the model folder's
// chat_template.jinja or tokenizer_config.json.

#include <optional>
#include <string>

namespace torchattn::models {

/// The folder's chat template text, or nullopt when it has none.
std::optional<std::string> read_chat_template(const std::string& model_dir);

/// `prompt` as one user turn, ready for the assistant's answer. A template that does
/// not use <|im_start|> is a std::runtime_error saying so.
std::string chat_prompt(const std::string& chat_template, const std::string& prompt);

} // namespace torchattn::models

#pragma once

// The chat format of models whose template uses <|im_start|> (SmolLM2, Qwen2):
//   <|im_start|>system\n...<|im_end|>\n<|im_start|>user\n...<|im_end|>\n<|im_start|>assistant\n
// with the template's own default system message, read from the model folder's
// chat_template.jinja or tokenizer_config.json.

#include <optional>
#include <string>
#include <vector>

namespace torchattn::models {

/// The folder's chat template text, or nullopt when it has none.
std::optional<std::string> read_chat_template(const std::string& model_dir);

/// `prompt` as one user turn, ready for the assistant's answer. A template that does
/// not use <|im_start|> is an error saying so.
std::string chat_prompt(const std::string& chat_template, const std::string& prompt);

/// One turn of a conversation: role "system", "user" or "assistant", and its text.
struct ChatMessage {
  std::string role;
  std::string content;
};

/// A conversation, ready for the assistant's next answer: each turn as
/// <|im_start|>role\ncontent<|im_end|>\n, after the template's default system turn
/// when the first turn is not a system one, as transformers' apply_chat_template(...,
/// add_generation_prompt=True) writes it for these templates. An empty conversation,
/// or a role other than system, user or assistant, is an error naming it.
std::string chat_prompt(const std::string& chat_template, const std::vector<ChatMessage>& messages);

}  // namespace torchattn::models

#include <torchattn/models/chat.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include <c10/util/Exception.h>

namespace torchattn::models {

std::optional<std::string> read_chat_template(const std::string& model_dir) {
  const auto dir = std::filesystem::path(model_dir);
  if (std::ifstream jinja(dir / "chat_template.jinja"); jinja) {
    return std::string(std::istreambuf_iterator<char>(jinja), std::istreambuf_iterator<char>());
  }
  if (std::ifstream config(dir / "tokenizer_config.json"); config) {
    const auto c = nlohmann::json::parse(config, nullptr, /*allow_exceptions=*/false);
    if (c.is_object() && c.contains("chat_template") && c["chat_template"].is_string()) {
      return c["chat_template"].get<std::string>();
    }
  }
  return std::nullopt;
}

namespace {

// The template's default system turn ("<|im_start|>system\n...<|im_end|>\n"), or ""
// when it writes none (or one with template syntax in it).
std::string default_system_turn(const std::string& chat_template) {
  TORCH_CHECK(chat_template.find("<|im_start|>") != std::string::npos,
              "chat_prompt: this model's chat template does "
              "not use <|im_start|>; pass the prompt as it should be tokenized instead");
  const std::string open = "<|im_start|>system\n";
  if (const auto at = chat_template.find(open); at != std::string::npos) {
    const auto end = chat_template.find("<|im_end|>", at + open.size());
    const std::string text = chat_template.substr(at + open.size(), end - at - open.size());
    if (end != std::string::npos && text.find("{{") == std::string::npos && text.find("{%") == std::string::npos) {
      return open + text + "<|im_end|>\n";
    }
  }
  return "";
}

}  // namespace

std::string chat_prompt(const std::string& chat_template, const std::string& prompt) {
  return chat_prompt(chat_template, std::vector<ChatMessage>{{"user", prompt}});
}

std::string chat_prompt(const std::string& chat_template, const std::vector<ChatMessage>& messages) {
  std::string out = default_system_turn(chat_template);
  TORCH_CHECK(!messages.empty(), "chat_prompt: expected at least one message, got none");
  if (messages.front().role == "system") out.clear();
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    TORCH_CHECK(m.role == "system" || m.role == "user" || m.role == "assistant", "chat_prompt: message ", i,
                " has role '", m.role, "'; expected system, user or assistant");
    out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  }
  return out + "<|im_start|>assistant\n";
}

}  // namespace torchattn::models

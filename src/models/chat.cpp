#include <torchattn/models/chat.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

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

std::string chat_prompt(const std::string& chat_template, const std::string& prompt) {
  if (chat_template.find("<|im_start|>") == std::string::npos) {
    TORCH_CHECK(false, "chat_prompt: this model's chat template does not use <|im_start|>; pass the prompt as it "
                             "should be tokenized instead");
  }
  // The default system turn, when the template writes one: the text after
  // "<|im_start|>system\n" up to the next <|im_end|>, without template syntax.
  std::string system;
  const std::string open = "<|im_start|>system\n";
  if (const auto at = chat_template.find(open); at != std::string::npos) {
    const auto end = chat_template.find("<|im_end|>", at + open.size());
    const std::string text = chat_template.substr(at + open.size(), end - at - open.size());
    if (end != std::string::npos && text.find("{{") == std::string::npos && text.find("{%") == std::string::npos) {
      system = open + text + "<|im_end|>\n";
    }
  }
  return system + "<|im_start|>user\n" + prompt + "<|im_end|>\n<|im_start|>assistant\n";
}

} // namespace torchattn::models

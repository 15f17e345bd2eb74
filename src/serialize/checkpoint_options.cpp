#include "serialize/checkpoint_options.h"

#include <c10/util/Exception.h>

#include <iomanip>
#include <map>
#include <sstream>

namespace torchattn::serialize {

namespace {

std::map<std::string, std::string> decode(const char* fn, const std::string& path, const std::string& saved) {
  std::map<std::string, std::string> out;
  std::istringstream in(saved);
  std::string item;
  while (std::getline(in, item, ';')) {
    const auto eq = item.find('=');
    TORCH_CHECK(eq != std::string::npos && eq > 0, fn, ": checkpoint entry '", path, kOptionsKey,
                "' is malformed: expected name=value pairs, got '", saved, "'");
    out[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return out;
}

}  // namespace

std::string option_text(int64_t v) { return std::to_string(v); }

std::string option_text(const std::optional<int64_t>& v) { return v ? std::to_string(*v) : "none"; }

std::string option_text(bool v) { return v ? "true" : "false"; }

std::string option_text(double v) {
  std::ostringstream s;
  s << std::setprecision(17) << v;
  return s.str();
}

std::string option_text(const std::optional<double>& v) { return v ? option_text(*v) : "default"; }

std::optional<OptionValues> checkpoint_options(const torch::nn::Module& module) {
  if (const auto* facts = dynamic_cast<const CheckpointFacts*>(&module)) {
    return facts->checkpoint_options();
  }
  return std::nullopt;
}

std::string encode_options(const OptionValues& options) {
  std::string out;
  for (const auto& [name, value] : options) {
    out.append(out.empty() ? "" : ";").append(name).append("=").append(value);
  }
  return out;
}

void check_saved_options(const char* fn, const std::string& path, const std::string& saved,
                         const OptionValues& module_options) {
  const auto values = decode(fn, path, saved);
  const std::string where = path.empty() ? "the module" : "'" + path.substr(0, path.size() - 1) + "'";
  for (const auto& [name, value] : module_options) {
    const auto it = values.find(name);
    // Options that set the tensors' shapes are named before the shapes are compared.
    const bool shapes = name == "num_kv_heads" || name == "head_dim" || name == "kdim" || name == "vdim";
    TORCH_CHECK(it == values.end() || it->second == value, fn, ": checkpoint of ", where, " was saved with ", name, "=",
                it->second, ", this module has ", name, "=", value,
                shapes ? " (the tensors' shapes differ with it)"
                       : " (the tensors have the same shapes, but the numbers would differ)");
  }
}

int64_t implied_causal_mask(const torch::nn::Module& module) {
  const auto* facts = dynamic_cast<const CheckpointFacts*>(&module);
  return facts != nullptr ? facts->implied_causal_mask() : 0;
}

std::string shape_hint(const torch::nn::Module& module, const std::string& key) {
  const auto* facts = dynamic_cast<const CheckpointFacts*>(&module);
  return facts != nullptr ? facts->shape_hint(key) : "";
}

}  // namespace torchattn::serialize

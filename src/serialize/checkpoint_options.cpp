#include "serialize/checkpoint_options.h"

#include <torchattn/causal_attention.h>
#include <torchattn/multi_head_attention.h>
#include <torchattn/self_attention_v2.h>

#include <c10/util/Exception.h>

#include <iomanip>
#include <map>
#include <sstream>

namespace torchattn::detail {

namespace {

std::string text(int64_t v) { return std::to_string(v); }

std::string text(const std::optional<int64_t>& v) { return v ? std::to_string(*v) : "none"; }

std::string text(bool v) { return v ? "true" : "false"; }

std::string text(double v) {
  std::ostringstream s;
  s << std::setprecision(17) << v;
  return s.str();
}

std::string text(const std::optional<double>& v) { return v ? text(*v) : "default"; }

// causal, window and rope, as the modules that have them record them.
void add_attention_options(OptionValues& out, bool causal, const std::optional<int64_t>& window,
                           const std::optional<RoPEOptions>& rope) {
  out.emplace_back("causal", text(causal));
  out.emplace_back("window", text(window));
  out.emplace_back("rope_theta", rope ? text(rope->theta()) : "none");
  out.emplace_back("rope_interleaved", rope ? text(rope->interleaved()) : "none");
  out.emplace_back("rope_rotary_dim", rope ? text(rope->rotary_dim()) : "none");
}

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

std::optional<OptionValues> checkpoint_options(const torch::nn::Module& module) {
  if (const auto* m = dynamic_cast<const MultiHeadAttentionImpl*>(&module)) {
    const auto& o = m->options;
    OptionValues out{{"num_heads", text(o.num_heads())},
                     {"num_kv_heads", text(m->num_kv_heads())},
                     {"head_dim", text(m->head_dim())},
                     {"qk_norm", !o.qk_norm()              ? "none"
                                 : o.qk_norm()->per_head() ? "per_head"
                                                           : "all_heads"},
                     {"qk_norm_eps", o.qk_norm() ? text(o.qk_norm()->eps()) : "none"},
                     {"alibi", text(o.alibi())},
                     {"softcap", o.softcap() ? text(*o.softcap()) : "none"},
                     {"sinks", text(o.sinks())},
                     {"scale", text(o.scale())},
                     // The context's widths for cross-attention (d_in where not set).
                     {"kdim", text(o.kdim().value_or(o.d_in()))},
                     {"vdim", text(o.vdim().value_or(o.d_in()))}};
    add_attention_options(out, o.causal(), o.window(), o.rope());
    return out;
  }
  if (const auto* m = dynamic_cast<const CausalAttentionImpl*>(&module)) {
    const auto& o = m->options;
    OptionValues out{{"scale", text(o.scale())}};
    add_attention_options(out, o.causal(), o.window(), o.rope());
    return out;
  }
  if (const auto* m = dynamic_cast<const SelfAttentionV2Impl*>(&module)) {
    return OptionValues{{"scale", text(m->options.scale())}};
  }
  return std::nullopt;
}

std::string encode_options(const OptionValues& options) {
  std::string out;
  for (const auto& [name, value] : options) {
    out += (out.empty() ? "" : ";") + name + "=" + value;
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
  if (const auto* m = dynamic_cast<const CausalAttentionImpl*>(&module);
      m != nullptr && m->options.causal() && !m->options.mask_buffer()) {
    return m->options.context_length();
  }
  if (const auto* m = dynamic_cast<const MultiHeadAttentionImpl*>(&module);
      m != nullptr && m->options.causal() && !m->options.mask_buffer()) {
    return m->options.context_length();
  }
  return 0;
}

std::string shape_hint(const torch::nn::Module& module, const std::string& key) {
  const auto* m = dynamic_cast<const MultiHeadAttentionImpl*>(&module);
  if (m == nullptr || !(key.starts_with("W_key.") || key.starts_with("W_value."))) {
    return "";
  }
  return " (" + key.substr(0, key.find('.')) +
         " projects to num_kv_heads * head_dim = " + std::to_string(m->num_kv_heads()) + " * " +
         std::to_string(m->head_dim()) + " features)";
}

}  // namespace torchattn::detail

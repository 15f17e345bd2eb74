#include "config.h"

#include "json_file.h"

#include <nlohmann/json.hpp>

#include <stdexcept>

namespace generate {

namespace {

using json = nlohmann::json;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error("config: '" + path + "': " + what);
}

int64_t positive(const json& c, const std::string& path, const char* key) {
  if (!c.contains(key) || !c[key].is_number_integer() || c[key].get<int64_t>() <= 0) {
    fail(path, std::string("expected a positive integer ") + key);
  }
  return c[key].get<int64_t>();
}

std::vector<int64_t> ids(const json& v) {
  std::vector<int64_t> out;
  if (v.is_number_integer()) out.push_back(v.get<int64_t>());
  if (v.is_array()) {
    for (const auto& x : v) out.push_back(x.get<int64_t>());
  }
  return out;
}

} // namespace

ModelConfig read_config(const std::string& path) {
  const json c = read_json_file(path, "config");
  ModelConfig m;
  m.model_type = c.value("model_type", std::string());
  if (m.model_type != "llama" && m.model_type != "qwen2" && m.model_type != "mistral") {
    fail(path, "model_type '" + m.model_type + "' is not one of llama, qwen2, mistral");
  }
  m.vocab_size = positive(c, path, "vocab_size");
  m.hidden_size = positive(c, path, "hidden_size");
  m.intermediate_size = positive(c, path, "intermediate_size");
  m.num_layers = positive(c, path, "num_hidden_layers");
  m.num_heads = positive(c, path, "num_attention_heads");
  m.num_kv_heads = c.contains("num_key_value_heads") && !c["num_key_value_heads"].is_null()
                       ? positive(c, path, "num_key_value_heads")
                       : m.num_heads;
  m.max_position_embeddings = positive(c, path, "max_position_embeddings");
  if (m.hidden_size % m.num_heads != 0) fail(path, "hidden_size is not a multiple of num_attention_heads");
  if (c.contains("head_dim") && !c["head_dim"].is_null() && c["head_dim"].get<int64_t>() != m.head_dim()) {
    fail(path, "head_dim " + std::to_string(c["head_dim"].get<int64_t>()) +
                   " differs from hidden_size / num_attention_heads = " + std::to_string(m.head_dim()));
  }
  if (c.value("hidden_act", std::string("silu")) != "silu") fail(path, "hidden_act is not silu");
  m.rms_norm_eps = c.value("rms_norm_eps", 1e-6);
  // RoPE: rope_parameters (transformers 5) or rope_theta; only the default kind.
  const json rope = c.contains("rope_parameters") && c["rope_parameters"].is_object() ? c["rope_parameters"] : c;
  m.rope_theta = rope.value("rope_theta", c.value("rope_theta", 10000.0));
  const json scaling = c.value("rope_scaling", json());
  const std::string rope_type = rope.value("rope_type", scaling.is_object() ? scaling.value("rope_type", std::string("default")) : std::string("default"));
  if (rope_type != "default") fail(path, "RoPE type '" + rope_type + "' is not supported (only the default)");
  m.tie_word_embeddings = c.value("tie_word_embeddings", false);
  if (m.model_type == "qwen2") {
    m.qkv_bias = true;
  } else {
    m.qkv_bias = m.o_bias = c.value("attention_bias", false);
  }
  m.mlp_bias = c.value("mlp_bias", false);
  m.windows.assign(static_cast<size_t>(m.num_layers), std::nullopt);
  const json window = c.value("sliding_window", json());
  if (window.is_number_integer()) {
    if (m.model_type == "mistral") {
      m.windows.assign(static_cast<size_t>(m.num_layers), window.get<int64_t>());
    } else if (c.contains("layer_types") && c["layer_types"].is_array()) {
      for (size_t i = 0; i < c["layer_types"].size() && i < m.windows.size(); ++i) {
        if (c["layer_types"][i] == "sliding_attention") m.windows[i] = window.get<int64_t>();
      }
    }
  }
  m.eos_token_ids = ids(c.value("eos_token_id", json()));
  if (c.contains("bos_token_id") && c["bos_token_id"].is_number_integer()) m.bos_token_id = c["bos_token_id"].get<int64_t>();
  return m;
}

} // namespace generate

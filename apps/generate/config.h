#pragma once

// A Hugging Face `config.json` of the Llama family (model_type llama, qwen2 or
// mistral), read into what the decoder needs.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace generate {

struct ModelConfig {
  std::string model_type;  // llama, qwen2, mistral
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2: true; Llama: attention_bias
  bool o_bias = false;    // Llama: attention_bias
  bool mlp_bias = false;
  /// Per layer: a sliding window (Mistral; Qwen2's sliding_attention layers), or none.
  std::vector<std::optional<int64_t>> windows;
  std::vector<int64_t> eos_token_ids;
  std::optional<int64_t> bos_token_id;

  int64_t head_dim() const { return hidden_size / num_heads; }
};

/// Reads `path`. Another model type, activation or RoPE scaling, or a missing
/// field, is a std::runtime_error naming it.
ModelConfig read_config(const std::string& path);

} // namespace generate

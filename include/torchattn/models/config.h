#pragma once

// A Hugging Face model folder's `config.json`, read into what a model needs: the
// decoders of the Llama family (model_type llama, qwen2, qwen3, mistral), Gemma 2
// (gemma2), the BERT encoders (model_type bert: BERT, MiniLM, ...) and the BART
// encoder-decoders (model_type bart).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace torchattn::models {

// Configs, not options: plain structs that mirror config.json's fields (no TORCH_ARG).
struct DecoderConfig {
  std::string model_type;  // llama, qwen2, qwen3, mistral, gemma2
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
  bool qk_norm = false;  // Qwen3: RMSNorm of each head's queries and keys (q_norm, k_norm)
  /// The gate's activation in the MLP: "silu" (SwiGLU, the Llama family) or "gelu_tanh"
  /// (GeGLU, Gemma 2's gelu_pytorch_tanh).
  std::string activation = "silu";
  /// Gemma 2: a norm after each sublayer as well as before it (post_attention_layernorm
  /// on the attention's output, pre_ and post_feedforward_layernorm around the MLP),
  /// norms that scale by 1 + weight, and the embeddings times sqrt(hidden_size).
  bool gemma_norms = false;
  /// Gemma 2: attn_logit_softcapping (the scores) and final_logit_softcapping (the
  /// logits), cap * tanh(x / cap); 0: none.
  double attn_softcap = 0.0;
  double final_softcap = 0.0;
  /// Gemma 2: query_pre_attn_scalar^-0.5, the scores' scale (else 1 / sqrt(head_dim)).
  std::optional<double> attn_scale;
  /// Per layer: a sliding window (Mistral; the sliding_attention layers of Qwen2 and
  /// Gemma 2), or none.
  std::vector<std::optional<int64_t>> windows;
  std::vector<int64_t> eos_token_ids;
  std::optional<int64_t> bos_token_id;

  /// config.json's head_dim where it gives one (Qwen3's 128 with hidden 1024 and 16
  /// heads), else 0.
  int64_t own_head_dim = 0;

  int64_t head_dim() const { return own_head_dim > 0 ? own_head_dim : hidden_size / num_heads; }
};

/// Reads a decoder's config.json at `path`. Another model type (the error names the
/// supported ones), activation or RoPE scaling, or a missing field, is a c10::Error
/// naming it and the file.
DecoderConfig read_decoder_config(const std::string& path);

struct BertConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t max_position_embeddings = 0;
  int64_t type_vocab_size = 2;
  double layer_norm_eps = 1e-12;
  int64_t pad_token_id = 0;
  double hidden_dropout = 0.1;     // hidden_dropout_prob: after each sublayer, in training mode
  double attention_dropout = 0.1;  // attention_probs_dropout_prob
};

/// Reads a BERT encoder's config.json (model_type bert; hidden_act gelu; absolute
/// position embeddings). Errors as read_decoder_config's.
BertConfig read_bert_config(const std::string& path);

struct BartConfig {
  int64_t vocab_size = 0;
  int64_t d_model = 0;
  int64_t encoder_layers = 0;
  int64_t decoder_layers = 0;
  int64_t encoder_attention_heads = 0;
  int64_t decoder_attention_heads = 0;
  int64_t encoder_ffn_dim = 0;
  int64_t decoder_ffn_dim = 0;
  /// Learned positions for this many tokens in the encoder's input and in the
  /// decoder's (each table has two rows more: BART's offset of 2).
  int64_t max_position_embeddings = 0;
  /// The MLP's activation: "gelu" (BART's, exact) or "relu".
  std::string activation = "gelu";
  /// The token embeddings times sqrt(d_model) (scale_embedding), else 1.
  bool scale_embedding = false;
  double dropout = 0.1;  // after each sublayer and the embeddings, in training mode
  double attention_dropout = 0.0;
  double activation_dropout = 0.0;  // after the MLP's activation
  int64_t pad_token_id = 1;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;
  /// The decoder's first input token (BART: 2, its </s>); bos_token_id where the
  /// folder gives none.
  int64_t decoder_start_token_id = 2;
  /// Generation: the first new token forced to this (forced_bos_token_id), the last
  /// one allowed by max_new_tokens forced to this (forced_eos_token_id), as
  /// transformers' generate does; none when absent or null.
  std::optional<int64_t> forced_bos_token_id;
  std::optional<int64_t> forced_eos_token_id;
};

/// Reads a BART encoder-decoder's config.json (model_type bart: post-norm layers,
/// learned positions, activation_function gelu or relu, tied embeddings). generate's
/// settings (decoder_start_token_id, or bos_token_id where it has none; eos_token_id,
/// forced_bos_token_id, forced_eos_token_id) come from the generation_config.json beside
/// it when there is one, and then from it alone, as transformers' generate reads them;
/// else from config.json. Errors as read_decoder_config's, naming the file.
BartConfig read_bart_config(const std::string& path);

/// The model_type of the config.json at `path` (an error naming the file when it has none).
std::string read_model_type(const std::string& path);

/// The model types this library runs, for error messages:
/// "llama, qwen2, qwen3, mistral, gemma2 (decoders); bert (encoders); bart (encoder-decoders)".
const char* supported_model_types();

}  // namespace torchattn::models

#pragma once

// A BART-style encoder-decoder language model (model_type bart) on torchattn's
// MultiHeadAttention, with transformers' BartForConditionalGeneration numerics:
// - shared token embeddings (times sqrt(d_model) with scale_embedding), plus learned
//   positions (BART's table starts at row 2), then a LayerNorm (layernorm_embedding);
// - post-norm encoder layers: self-attention (causal(false), over the unpadded tokens)
//   -> residual -> LayerNorm, fc1 -> GELU -> fc2 -> residual -> LayerNorm;
// - post-norm decoder layers: causal self-attention (a KVCache while generating),
//   cross-attention over the encoder's output (forward_cross over keys and values
//   computed once, torchattn::CrossKV), then the MLP, each followed by its residual sum
//   and LayerNorm;
// - the output head: the shared embeddings (tied, as BART's) plus final_logits_bias.
//
//   auto config = torchattn::models::read_bart_config("tiny-bart/config.json");
//   torchattn::models::Seq2SeqLM model(config);
//   model->load_hf_weights("tiny-bart");
//   auto out = torchattn::models::generate(*model, {{0, 31414, 232, 2}});  // see seq2seq_generation.h
//
// State-dict names are transformers' without the "model." prefix, with the attention
// projections named as in the notebooks (W_query, W_key, W_value, out_proj):
// "encoder.layers.0.self_attn.W_query.weight", "decoder.layers.1.encoder_attn.out_proj.bias",
// "shared.weight", "final_logits_bias".

#include <torchattn/cross_kv.h>
#include <torchattn/kv_cache.h>
#include <torchattn/models/config.h>
#include <torchattn/models/weights.h>
#include <torchattn/multi_head_attention.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>
#include <vector>

namespace torchattn::models {

class BartEncoderLayerImpl : public torch::nn::Module {
 public:
  explicit BartEncoderLayerImpl(const BartConfig& config);
  /// x: [B, S, d_model]; key_padding_mask: [B, S] bool (true = padding) or undefined.
  /// -> [B, S, d_model].
  at::Tensor forward(const at::Tensor& x, const at::Tensor& key_padding_mask = {});

  torchattn::MultiHeadAttention self_attn{nullptr};  // causal(false), biases
  torch::nn::LayerNorm self_attn_layer_norm{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};  // the MLP: fc2(dropout(activation(fc1(x))))
  torch::nn::LayerNorm final_layer_norm{nullptr};
  torch::nn::Dropout dropout{nullptr}, activation_dropout{nullptr};

 private:
  bool relu_ = false;
};
TORCH_MODULE(BartEncoderLayer);

class BartDecoderLayerImpl : public torch::nn::Module {
 public:
  explicit BartDecoderLayerImpl(const BartConfig& config);
  /// x: [B, T, d_model] after the tokens in `cache` (null: none, a full forward);
  /// context: this layer's keys and values of the encoder's output (encoder_attn's
  /// cross_kv). -> [B, T, d_model].
  at::Tensor forward(const at::Tensor& x, const torchattn::CrossKV& context, torchattn::KVCache* cache = nullptr);

  torchattn::MultiHeadAttention self_attn{nullptr};  // causal
  torch::nn::LayerNorm self_attn_layer_norm{nullptr};
  torchattn::MultiHeadAttention encoder_attn{nullptr};  // causal(false), over the encoder's output
  torch::nn::LayerNorm encoder_attn_layer_norm{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::LayerNorm final_layer_norm{nullptr};
  torch::nn::Dropout dropout{nullptr}, activation_dropout{nullptr};

 private:
  bool relu_ = false;
};
TORCH_MODULE(BartDecoderLayer);

/// The encoder's or the decoder's stack: learned positions, layernorm_embedding and
/// the layers (the token embeddings are the model's `shared`).
class BartStackImpl : public torch::nn::Module {
 public:
  BartStackImpl(const BartConfig& config, bool decoder);
  /// embeds: [B, T, d_model] token embeddings of positions past .. past + T - 1
  /// -> the first layer's input (positions added, normed, dropout).
  at::Tensor embed(const at::Tensor& embeds, int64_t past = 0);

  torch::nn::Embedding embed_positions{nullptr};  // [max_position_embeddings + 2, d_model]
  torch::nn::LayerNorm layernorm_embedding{nullptr};
  torch::nn::ModuleList layers{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(BartStack);

class Seq2SeqLMImpl : public torch::nn::Module {
 public:
  explicit Seq2SeqLMImpl(const BartConfig& config);

  /// ids: [B, S] int64 (1 <= S <= max_position_embeddings, each id below vocab_size);
  /// key_padding_mask: [B, S] bool (true = padding) or undefined. Positions count from
  /// 0 in every row, as transformers' BART: pad on the right to give each row the
  /// numbers it has alone. -> the encoder's output [B, S, d_model] (transformers'
  /// encoder_outputs.last_hidden_state); rows of padding have no meaning.
  at::Tensor encode(const at::Tensor& ids, const at::Tensor& key_padding_mask = {});

  /// The encoder's output [B, S, d_model] and its padding [B, S] (or undefined) -> each
  /// decoder layer's cross-attention keys and values, computed once for every step.
  std::vector<torchattn::CrossKV> cross_kvs(const at::Tensor& encoder_out, const at::Tensor& key_padding_mask = {});

  /// One self-attention KVCache per decoder layer for `batch` sequences of up to
  /// max_position_embeddings decoder tokens.
  std::vector<torchattn::KVCache> make_kv_caches(int64_t batch) const;

  /// decoder_ids: [B, T] int64 after the tokens in `caches` (null: a full forward of
  /// the decoder from its first token); context: cross_kvs of the encoder's output.
  /// -> logits [B, T, vocab] (last_only: [B, 1, vocab]), in the model's dtype.
  at::Tensor decode(const at::Tensor& decoder_ids, const std::vector<torchattn::CrossKV>& context,
                    std::vector<torchattn::KVCache>* caches = nullptr, bool last_only = false);

  /// The whole model, as transformers' forward(input_ids, attention_mask,
  /// decoder_input_ids): ids [B, S], key_padding_mask [B, S] or undefined,
  /// decoder_ids [B, T] -> logits [B, T, vocab].
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& key_padding_mask, const at::Tensor& decoder_ids);

  /// The rules from a Hugging Face BART checkpoint's names to this module's
  /// ("model.decoder.layers.0.encoder_attn.q_proj.weight" ->
  /// "decoder.layers.0.encoder_attn.W_query.weight");
  /// the tied copies of the shared embeddings (encoder and decoder embed_tokens, lm_head) are ignored.
  WeightsOptions hf_weights() const;
  /// Loads a checkpoint (a .safetensors file, a sharded index or a folder) strictly.
  void load_hf_weights(const std::string& path);

  const BartConfig& config() const { return config_; }

  torch::nn::Embedding shared{nullptr};
  BartStack encoder{nullptr}, decoder{nullptr};
  at::Tensor final_logits_bias;  // buffer [1, vocab]

 private:
  // ids -> token embeddings times embed_scale.
  at::Tensor embed_tokens(const at::Tensor& ids);
  void check_ids(const at::Tensor& ids, const char* name, int64_t past) const;

  BartConfig config_;
};
TORCH_MODULE(Seq2SeqLM);

}  // namespace torchattn::models

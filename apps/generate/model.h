#pragma once

// A Llama-family decoder (Llama, Qwen2, Mistral) built on torchattn's
// MultiHeadAttention: token embeddings, pre-norm layers (RMSNorm -> grouped-query
// attention with RoPE -> residual, RMSNorm -> SwiGLU MLP -> residual), a final RMSNorm
// and an output head (tied to the embeddings or not), with transformers' numerics.

#include "config.h"

#include <torchattn/torchattn.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>
#include <vector>

namespace generate {

/// transformers' LlamaRMSNorm: in float32, x / sqrt(mean(x^2) + eps), back to x's
/// dtype, times the weight.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t size, double eps);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;
  double eps;
};
TORCH_MODULE(RMSNorm);

class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(const ModelConfig& c, int64_t layer, int64_t context_length);
  /// x: [B, T, hidden] after the tokens in `cache` (null: none) -> [B, T, hidden].
  at::Tensor forward(const at::Tensor& x, torchattn::KVCache* cache, const at::Tensor& key_padding_mask);

  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  torchattn::MultiHeadAttention self_attn{nullptr};
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(DecoderLayer);

class CausalLMImpl : public torch::nn::Module {
 public:
  /// context_length: the most tokens a sequence may have here (prompt and new tokens;
  /// at most the config's max_position_embeddings): the KV caches' size.
  CausalLMImpl(const ModelConfig& config, int64_t context_length);

  /// Loads a checkpoint's tensors under their Hugging Face names
  /// (model.layers.0.self_attn.q_proj.weight, ...). Strict: a missing, unexpected or
  /// misshapen tensor is a c10::Error naming it. float32 tensors of a CPU model are
  /// used in place (the checkpoint's memory map, no second copy); others are converted.
  void load_weights(const torchattn::NamedTensors& tensors);

  /// One KV cache per layer for `batch` sequences.
  std::vector<torchattn::KVCache> make_caches(int64_t batch, bool static_shapes = false) const;

  /// ids: [B, T] int64 after the tokens in `caches` (null: a full forward).
  /// key_padding_mask: [B, T] bool (true = padding) or undefined.
  /// Returns logits [B, T, vocab] (last_only: [B, 1, vocab]), in the model's dtype.
  at::Tensor forward(const at::Tensor& ids, std::vector<torchattn::KVCache>* caches = nullptr,
                     const at::Tensor& key_padding_mask = {}, bool last_only = false);

  const ModelConfig& config() const { return config_; }
  int64_t context_length() const { return context_length_; }

  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
  torch::nn::Linear lm_head{nullptr};  // null when tied to embed_tokens

 private:
  ModelConfig config_;
  int64_t context_length_;
};
TORCH_MODULE(CausalLM);

/// The Hugging Face name of each of the model's tensors, as `named_parameters()` keys
/// map to them: "layers.0.self_attn.W_query.weight" -> "model.layers.0.self_attn.q_proj.weight".
std::string hf_name(const std::string& name);

} // namespace generate

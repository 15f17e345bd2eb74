#pragma once

// A BERT encoder (model_type bert: BERT, MiniLM, ...) on torchattn's
// MultiHeadAttention with causal(false): word, position and token type embeddings
// and a LayerNorm, then post-norm layers (attention -> residual -> LayerNorm, GELU
// MLP -> residual -> LayerNorm), with transformers' BertModel numerics.
//
//   torchattn::models::BertModel bert(torchattn::models::read_bert_config("MiniLM/config.json"));
//   torchattn::models::load_weights(*bert, "MiniLM", bert->hf_weights());
//   at::Tensor hidden = bert(ids, key_padding_mask);  // [B, T, hidden_size]

#include <torchattn/models/config.h>
#include <torchattn/models/weights.h>
#include <torchattn/multi_head_attention.h>
#include <torchattn/linear.h>
#include <torchattn/packed_linear.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <memory>

namespace torchattn::models {

class BertEmbeddingsImpl : public torch::nn::Module {
 public:
  explicit BertEmbeddingsImpl(const BertConfig& config);
  /// ids: [B, T] int64 (T <= max_position_embeddings); token_type_ids: the same shape,
  /// or undefined for type 0 everywhere. -> [B, T, hidden_size]. Positions count
  /// from 0 in every row (pad on the right, as BERT's tokenizers do).
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& token_type_ids = {});

  torch::nn::Embedding word_embeddings{nullptr}, position_embeddings{nullptr}, token_type_embeddings{nullptr};
  torch::nn::LayerNorm LayerNorm{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(BertEmbeddings);

class BertLayerImpl : public torch::nn::Module {
 public:
  /// pack_weights: inference on the CPU in float32 runs every linear layer on a
  /// oneDNN-packed copy of its weights (torchattn::Linear::set_inference): faster, for
  /// a second copy of the weights.
  explicit BertLayerImpl(const BertConfig& config, bool pack_weights = false);
  /// x: [B, T, hidden_size]; key_padding_mask: [B, T] bool, true = padding, or undefined.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& key_padding_mask = {});
  /// See BertModelImpl::freeze_weights.
  void freeze_weights(WeightFormat format);

  MultiHeadAttention attention{nullptr};  // causal(false), biases: W_query, W_key, W_value, out_proj
  torch::nn::LayerNorm attention_norm{nullptr};
  Linear intermediate{nullptr}, output{nullptr};
  torch::nn::LayerNorm output_norm{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(BertLayer);

class BertModelImpl : public torch::nn::Module {
 public:
  /// pack_weights: see BertLayerImpl (SentenceEncoder::from_pretrained sets it from
  /// LoadOptions). Default false: at::linear, bit for bit as transformers on the CPU.
  explicit BertModelImpl(const BertConfig& config, bool pack_weights = false);

  /// For CPU inference in less memory: every layer's linear layers (attention and
  /// MLP) keep their weights in `format` (bfloat16 or int8, torchattn::WeightFormat)
  /// and their float32 copies are freed; the embeddings stay float32. Afterwards a
  /// forward with a gradient to compute is an error. Needs a float32 model on the CPU.
  void freeze_weights(WeightFormat format);

  /// ids: [B, T] int64, each below vocab_size, T <= max_position_embeddings.
  /// key_padding_mask: [B, T] bool, true = padding (from a Hugging Face attention_mask:
  /// torchattn::padding_mask_from_attention_mask), or undefined for none.
  /// token_type_ids: [B, T] int64 or undefined (all 0).
  /// -> the last layer's hidden states [B, T, hidden_size] (transformers'
  /// last_hidden_state); rows of padding tokens have no meaning.
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& key_padding_mask = {},
                     const at::Tensor& token_type_ids = {});

  /// The rules from a Hugging Face BERT checkpoint's names to this module's
  /// ("encoder.layer.0.attention.self.query.weight" -> "layers.0.attention.W_query.weight");
  /// the pooler, heads and the position_ids buffer are ignored; a "bert." prefix is dropped.
  static WeightsOptions hf_weights();

  const BertConfig& config() const { return config_; }

  BertEmbeddings embeddings{nullptr};
  torch::nn::ModuleList layers{nullptr};

 protected:
  FORWARD_HAS_DEFAULT_ARGS({1, torch::nn::AnyValue(at::Tensor())}, {2, torch::nn::AnyValue(at::Tensor())})

 private:
  BertConfig config_;
};
TORCH_MODULE(BertModel);

}  // namespace torchattn::models

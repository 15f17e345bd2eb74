#include <torchattn/models/seq2seq_lm.h>

#include <torchattn/functional.h>

#include <ATen/ops/arange.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <utility>

namespace torchattn::models {

namespace {

// BART's learned position tables start at row 2 (fairseq kept rows 0 and 1 for padding).
constexpr int64_t kPositionOffset = 2;

torchattn::MultiHeadAttention attention(const BartConfig& c, int64_t heads, bool causal) {
  return torchattn::MultiHeadAttention(
      torchattn::MultiHeadAttentionOptions(c.d_model, c.d_model, c.max_position_embeddings, heads)
          .causal(causal)
          .qkv_bias(true)
          .dropout(c.attention_dropout)
          .mask_buffer(false));
}

torch::nn::LayerNorm layer_norm(const BartConfig& c) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model}).eps(1e-5));  // nn.LayerNorm's default
}

// fc2(dropout(activation(fc1(x)))): at::linear, as PyTorch's nn.Linear (LibTorch's
// Linear takes a matmul and an add for 3-d inputs: other roundings).
at::Tensor mlp(const torch::nn::Linear& fc1, const torch::nn::Linear& fc2, torch::nn::Dropout& dropout, bool relu,
               const at::Tensor& x) {
  const bool in_place = !c10::GradMode::is_enabled();
  at::Tensor h = torchattn::functional::linear(x, fc1->weight, fc1->bias);
  h = relu ? (in_place ? at::relu_(h) : at::relu(h)) : (in_place ? at::gelu_(h) : at::gelu(h));
  return torchattn::functional::linear(dropout(h), fc2->weight, fc2->bias);
}

// norm(x + dropout(sublayer)), the sum in place without autograd (the same values).
at::Tensor post_norm(torch::nn::LayerNorm& norm, torch::nn::Dropout& dropout, at::Tensor sublayer,
                     const at::Tensor& x) {
  sublayer = dropout(sublayer);
  return norm(c10::GradMode::is_enabled() ? sublayer + x : sublayer.add_(x));
}

}  // namespace

BartEncoderLayerImpl::BartEncoderLayerImpl(const BartConfig& c) : relu_(c.activation == "relu") {
  self_attn = register_module("self_attn", attention(c, c.encoder_attention_heads, /*causal=*/false));
  self_attn_layer_norm = register_module("self_attn_layer_norm", layer_norm(c));
  fc1 = register_module("fc1", torch::nn::Linear(c.d_model, c.encoder_ffn_dim));
  fc2 = register_module("fc2", torch::nn::Linear(c.encoder_ffn_dim, c.d_model));
  final_layer_norm = register_module("final_layer_norm", layer_norm(c));
  dropout = register_module("dropout", torch::nn::Dropout(c.dropout));
  activation_dropout = register_module("activation_dropout", torch::nn::Dropout(c.activation_dropout));
}

at::Tensor BartEncoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& key_padding_mask) {
  const at::Tensor h = post_norm(self_attn_layer_norm, dropout, self_attn(x, key_padding_mask), x);
  at::Tensor out = post_norm(final_layer_norm, dropout, mlp(fc1, fc2, activation_dropout, relu_, h), h);
  // transformers' BartEncoderLayer: a float16 output that overflowed is clamped to
  // finite values (BART-large's activations pass float16's range).
  if (out.scalar_type() == at::kHalf && !at::isfinite(out).all().item<bool>()) {
    const double limit = 65504.0 - 1000.0;  // torch.finfo(torch.float16).max - 1000
    out = at::clamp(out, -limit, limit);
  }
  return out;
}

BartDecoderLayerImpl::BartDecoderLayerImpl(const BartConfig& c) : relu_(c.activation == "relu") {
  self_attn = register_module("self_attn", attention(c, c.decoder_attention_heads, /*causal=*/true));
  self_attn_layer_norm = register_module("self_attn_layer_norm", layer_norm(c));
  encoder_attn = register_module("encoder_attn", attention(c, c.decoder_attention_heads, /*causal=*/false));
  encoder_attn_layer_norm = register_module("encoder_attn_layer_norm", layer_norm(c));
  fc1 = register_module("fc1", torch::nn::Linear(c.d_model, c.decoder_ffn_dim));
  fc2 = register_module("fc2", torch::nn::Linear(c.decoder_ffn_dim, c.d_model));
  final_layer_norm = register_module("final_layer_norm", layer_norm(c));
  dropout = register_module("dropout", torch::nn::Dropout(c.dropout));
  activation_dropout = register_module("activation_dropout", torch::nn::Dropout(c.activation_dropout));
}

at::Tensor BartDecoderLayerImpl::forward(const at::Tensor& x, const torchattn::CrossKV& context,
                                         torchattn::KVCache* cache) {
  const at::Tensor a = cache != nullptr ? self_attn->forward_cached(x, *cache) : self_attn->forward(x);
  const at::Tensor h = post_norm(self_attn_layer_norm, dropout, a, x);
  const at::Tensor g = post_norm(encoder_attn_layer_norm, dropout, encoder_attn->forward_cross(h, context), h);
  return post_norm(final_layer_norm, dropout, mlp(fc1, fc2, activation_dropout, relu_, g), g);
}

BartStackImpl::BartStackImpl(const BartConfig& c, bool decoder) {
  embed_positions = register_module("embed_positions",
                                    torch::nn::Embedding(c.max_position_embeddings + kPositionOffset, c.d_model));
  layernorm_embedding = register_module("layernorm_embedding", layer_norm(c));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < (decoder ? c.decoder_layers : c.encoder_layers); ++i) {
    if (decoder) {
      layers->push_back(BartDecoderLayer(c));
    } else {
      layers->push_back(BartEncoderLayer(c));
    }
  }
  dropout = register_module("dropout", torch::nn::Dropout(c.dropout));
}

at::Tensor BartStackImpl::embed(const at::Tensor& embeds, int64_t past) {
  const at::Tensor positions = at::arange(past + kPositionOffset, past + kPositionOffset + embeds.size(1),
                                          embeds.options().dtype(at::kLong));
  return dropout(layernorm_embedding(embeds + embed_positions(positions)));
}

Seq2SeqLMImpl::Seq2SeqLMImpl(const BartConfig& config) : config_(config) {
  TORCH_CHECK(config.activation == "gelu" || config.activation == "relu",
              "Seq2SeqLM: expected the activation gelu or relu, got '", config.activation, "'");
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"vocab_size", config.vocab_size},
                                    {"d_model", config.d_model},
                                    {"max_position_embeddings", config.max_position_embeddings},
                                    {"encoder_layers", config.encoder_layers},
                                    {"decoder_layers", config.decoder_layers},
                                    {"encoder_attention_heads", config.encoder_attention_heads},
                                    {"decoder_attention_heads", config.decoder_attention_heads},
                                    {"encoder_ffn_dim", config.encoder_ffn_dim},
                                    {"decoder_ffn_dim", config.decoder_ffn_dim}}) {
    TORCH_CHECK(value >= 1, "Seq2SeqLM: expected ", name, " >= 1, got ", value);
  }
  auto check_id = [&](const char* name, int64_t id) {
    TORCH_CHECK(id >= 0 && id < config.vocab_size, "Seq2SeqLM: expected ", name, " in [0, vocab_size ",
                config.vocab_size, "), got ", id);
  };
  check_id("pad_token_id", config.pad_token_id);
  check_id("decoder_start_token_id", config.decoder_start_token_id);
  if (config.forced_bos_token_id) check_id("forced_bos_token_id", *config.forced_bos_token_id);
  if (config.forced_eos_token_id) check_id("forced_eos_token_id", *config.forced_eos_token_id);
  // BartScaledWordEmbedding's padding_idx: no gradient reaches the pad token's row
  // through the lookups (the tied head's still does).
  shared = register_module("shared", torch::nn::Embedding(torch::nn::EmbeddingOptions(config.vocab_size, config.d_model)
                                                              .padding_idx(config.pad_token_id)));
  encoder = register_module("encoder", BartStack(config, /*decoder=*/false));
  decoder = register_module("decoder", BartStack(config, /*decoder=*/true));
  final_logits_bias = register_buffer("final_logits_bias", at::zeros({1, config.vocab_size}));
}

at::Tensor Seq2SeqLMImpl::embed_tokens(const at::Tensor& ids) {
  at::Tensor x = shared(ids);
  if (!config_.scale_embedding) return x;
  // BartScaledWordEmbedding: times sqrt(d_model) as a Python float.
  return x * std::sqrt(static_cast<double>(config_.d_model));
}

void Seq2SeqLMImpl::check_ids(const at::Tensor& ids, const char* name, int64_t past) const {
  TORCH_CHECK(ids.dim() == 2 && ids.scalar_type() == at::kLong, "Seq2SeqLM: expected ", name, " as int64 [B, T], got ",
              ids.sizes(), " of ", ids.scalar_type());
  TORCH_CHECK(ids.size(1) >= 1 && past + ids.size(1) <= config_.max_position_embeddings, "Seq2SeqLM: ", name,
              " reach position ", past + ids.size(1), "; the model has positions for 1 to ",
              config_.max_position_embeddings, " tokens (max_position_embeddings)");
}

at::Tensor Seq2SeqLMImpl::encode(const at::Tensor& ids, const at::Tensor& key_padding_mask) {
  check_ids(ids, "ids", 0);
  TORCH_CHECK(!key_padding_mask.defined() || key_padding_mask.sizes() == ids.sizes(),
              "Seq2SeqLM: expected "
              "key_padding_mask ",
              ids.sizes(), " as ids, got ", key_padding_mask.sizes());
  at::Tensor x = encoder->embed(embed_tokens(ids));
  for (const auto& layer : *encoder->layers) x = layer->as<BartEncoderLayerImpl>()->forward(x, key_padding_mask);
  return x;
}

std::vector<torchattn::CrossKV> Seq2SeqLMImpl::cross_kvs(const at::Tensor& encoder_out,
                                                         const at::Tensor& key_padding_mask) {
  std::vector<torchattn::CrossKV> out;
  for (const auto& layer : *decoder->layers) {
    out.push_back(layer->as<BartDecoderLayerImpl>()->encoder_attn->cross_kv(encoder_out, key_padding_mask));
  }
  return out;
}

std::vector<torchattn::KVCache> Seq2SeqLMImpl::make_kv_caches(int64_t batch) const {
  std::vector<torchattn::KVCache> caches;
  for (const auto& layer : *decoder->layers) {
    caches.push_back(layer->as<BartDecoderLayerImpl>()->self_attn->make_kv_cache(batch));
  }
  return caches;
}

at::Tensor Seq2SeqLMImpl::decode(const at::Tensor& decoder_ids, const std::vector<torchattn::CrossKV>& context,
                                 std::vector<torchattn::KVCache>* caches, bool last_only) {
  const size_t n = decoder->layers->size();
  TORCH_CHECK(context.size() == n, "Seq2SeqLM: expected the cross keys and values of ", n,
              " decoder layers (cross_kvs), got ", context.size());
  TORCH_CHECK(caches == nullptr || caches->size() == n, "Seq2SeqLM: expected ", n, " caches (make_kv_caches), got ",
              caches == nullptr ? 0 : caches->size());
  const int64_t past = caches != nullptr ? caches->front().length() : 0;
  check_ids(decoder_ids, "decoder_ids", past);
  TORCH_CHECK(context.front().batch_size() == decoder_ids.size(0), "Seq2SeqLM: decoder_ids have ", decoder_ids.size(0),
              " rows; the encoder's output has ", context.front().batch_size());
  at::Tensor x = decoder->embed(embed_tokens(decoder_ids), past);
  for (size_t i = 0; i < n; ++i) {
    x = decoder->layers[i]->as<BartDecoderLayerImpl>()->forward(x, context[i],
                                                                caches != nullptr ? &(*caches)[i] : nullptr);
  }
  if (last_only) x = x.narrow(1, x.size(1) - 1, 1);
  const at::Tensor logits = torchattn::functional::linear(x, shared->weight);
  return c10::GradMode::is_enabled() ? logits + final_logits_bias : logits.add_(final_logits_bias);
}

at::Tensor Seq2SeqLMImpl::forward(const at::Tensor& ids, const at::Tensor& key_padding_mask,
                                  const at::Tensor& decoder_ids) {
  TORCH_CHECK(decoder_ids.dim() == 2 && ids.dim() == 2 && decoder_ids.size(0) == ids.size(0), "Seq2SeqLM: expected ",
              "decoder_ids [B, T] for ids [B, S] of the same B, got ", decoder_ids.sizes(), " and ", ids.sizes());
  const at::Tensor out = encode(ids, key_padding_mask);
  return decode(decoder_ids, cross_kvs(out, key_padding_mask));
}

WeightsOptions Seq2SeqLMImpl::hf_weights() const {
  // Tied copies of `shared`, where a checkpoint saves them anyway.
  return WeightsOptions()
      .rename({{"model", ""}, {"q_proj", "W_query"}, {"k_proj", "W_key"}, {"v_proj", "W_value"}})
      .ignore({"model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight"});
}

void Seq2SeqLMImpl::load_hf_weights(const std::string& path) { load_weights(*this, path, hf_weights()); }

}  // namespace torchattn::models

#include <torchattn/models/bert.h>

#include <ATen/ops/arange.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/linear.h>
#include <c10/core/GradMode.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>

namespace torchattn::models {

BertEmbeddingsImpl::BertEmbeddingsImpl(const BertConfig& c) {
  word_embeddings = register_module("word_embeddings", torch::nn::Embedding(c.vocab_size, c.hidden_size));
  position_embeddings = register_module("position_embeddings",
                                        torch::nn::Embedding(c.max_position_embeddings, c.hidden_size));
  token_type_embeddings = register_module("token_type_embeddings",
                                          torch::nn::Embedding(c.type_vocab_size, c.hidden_size));
  LayerNorm = register_module("LayerNorm",
                              torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden_size}).eps(c.layer_norm_eps)));
  dropout = register_module("dropout", torch::nn::Dropout(c.hidden_dropout));
}

at::Tensor BertEmbeddingsImpl::forward(const at::Tensor& ids, const at::Tensor& token_type_ids) {
  const int64_t T = ids.size(1);
  const at::Tensor positions = at::arange(T, ids.options());
  at::Tensor x = word_embeddings(ids);
  x = x + (token_type_ids.defined() ? token_type_embeddings(token_type_ids) : token_type_embeddings->weight[0]);
  x = x + position_embeddings(positions);
  return dropout(LayerNorm(x));
}

BertLayerImpl::BertLayerImpl(const BertConfig& c, bool pack_weights) {
  attention = register_module("attention",
                              MultiHeadAttention(MultiHeadAttentionOptions(c.hidden_size, c.hidden_size,
                                                                           c.max_position_embeddings, c.num_heads)
                                                     .causal(false)
                                                     .qkv_bias(true)
                                                     .dropout(c.attention_dropout)
                                                     .projections({.pack = {.on = pack_weights}})));
  const auto norm = torch::nn::LayerNormOptions({c.hidden_size}).eps(c.layer_norm_eps);
  attention_norm = register_module("attention_norm", torch::nn::LayerNorm(norm));
  intermediate = register_module("intermediate", Linear(c.hidden_size, c.intermediate_size));
  output = register_module("output", Linear(c.intermediate_size, c.hidden_size));
  output_norm = register_module("output_norm", torch::nn::LayerNorm(norm));
  dropout = register_module("dropout", torch::nn::Dropout(c.hidden_dropout));
  // Every call: min_rows 1, as the attention's own default (projections().pack).
  for (auto* l : {&intermediate, &output}) (*l)->set_inference({.on = pack_weights, .min_rows = 1});
}

void BertLayerImpl::freeze_weights(WeightFormat format) {
  attention->options.projections().format = format;
  attention->freeze_weights();
  intermediate->freeze(format);
  output->freeze(format);
}

at::Tensor BertLayerImpl::forward(const at::Tensor& x, const at::Tensor& key_padding_mask) {
  // torchattn::Linear: at::linear, as PyTorch's nn.Linear (one addmm for the rows of
  // every sequence); with pack_weights, where it applies (CPU float32 inference),
  // oneDNN on a packed copy; frozen, the kept format.
  // Without autograd, the sums and GELU are written in place: the same values.
  const bool in_place = !c10::GradMode::is_enabled();
  const at::Tensor a = dropout(attention(x, key_padding_mask));
  const at::Tensor h = attention_norm(in_place ? a.add_(x) : a + x);
  at::Tensor m = intermediate(h);
  m = dropout(output(in_place ? at::gelu_(m) : at::gelu(m)));
  return output_norm(in_place ? m.add_(h) : m + h);
}

BertModelImpl::BertModelImpl(const BertConfig& config, bool pack_weights) : config_(config) {
  embeddings = register_module("embeddings", BertEmbeddings(config));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_layers; ++i) layers->push_back(BertLayer(config, pack_weights));
}

void BertModelImpl::freeze_weights(WeightFormat format) {
  check_weight_format(format, "BertModel: freeze_weights");
  TORCH_CHECK(format != WeightFormat::Float32,
              "BertModel: freeze_weights keeps bfloat16, int8, int4 or dynamic-int8 weights, got float32");
  const at::Tensor& w = embeddings->word_embeddings->weight;
  TORCH_CHECK(w.is_cpu() && w.scalar_type() == at::kFloat,
              "BertModel: freeze_weights needs a float32 model on the CPU, "
              "got weights of ",
              w.scalar_type(), " on ", w.device());
  for (const auto& layer : *layers) layer->as<BertLayerImpl>()->freeze_weights(format);
}

at::Tensor BertModelImpl::forward(const at::Tensor& ids, const at::Tensor& key_padding_mask,
                                  const at::Tensor& token_type_ids) {
  TORCH_CHECK(ids.dim() == 2 && ids.scalar_type() == at::kLong, "BertModel: expected int64 ids [B, T], got ",
              ids.sizes(), " of ", ids.scalar_type());
  TORCH_CHECK(ids.size(1) >= 1 && ids.size(1) <= config_.max_position_embeddings, "BertModel: ids have ", ids.size(1),
              " tokens; the model has positions for 1 to ", config_.max_position_embeddings);
  TORCH_CHECK(!token_type_ids.defined() || token_type_ids.sizes() == ids.sizes(), "BertModel: expected token_type_ids ",
              ids.sizes(), " as ids, got ", token_type_ids.sizes());
  at::Tensor x = embeddings(ids, token_type_ids);
  for (const auto& layer : *layers) x = layer->as<BertLayerImpl>()->forward(x, key_padding_mask);
  return x;
}

WeightsOptions BertModelImpl::hf_weights() {
  return WeightsOptions()
      .rename({{"bert", ""},
               {"encoder.layer", "layers"},
               {"attention.self.query", "attention.W_query"},
               {"attention.self.key", "attention.W_key"},
               {"attention.self.value", "attention.W_value"},
               {"attention.output.dense", "attention.out_proj"},
               {"attention.output.LayerNorm", "attention_norm"},
               {"intermediate.dense", "intermediate"},
               {"output.dense", "output"},
               {"output.LayerNorm", "output_norm"}})
      .ignore({"embeddings.position_ids", "embeddings.token_type_ids", "pooler", "cls"});
}

}  // namespace torchattn::models

#include <torchattn/models/causal_lm.h>
#include <torchattn/models/saved_folder.h>


#include <ATen/ops/aminmax.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/tensor.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace torchattn::models {

namespace {

// An Init cast from an integer is named, not taken as ForLoading.
void check_init(Init init, const char* what) {
  TORCH_CHECK(init == Init::Random || init == Init::ForLoading, what, ": init: expected Init::Random or ",
              "Init::ForLoading, got the value ", static_cast<int>(init), " (an integer cast to Init?)");
}

}  // namespace

DecoderLayerImpl::DecoderLayerImpl(const DecoderConfig& c, int64_t layer, int64_t context_length, Init init) {
  TORCH_CHECK(c.activation == "silu" || c.activation == "gelu_tanh",
              "DecoderLayer: expected the activation silu or "
              "gelu_tanh, got '",
              c.activation, "'");
  gelu_tanh_ = c.activation == "gelu_tanh";
  check_init(init, "DecoderLayer");
  const bool gemma = c.gemma_norms;
  const bool random = init == Init::Random;
  input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps, gemma));
  auto attn = torchattn::MultiHeadAttentionOptions(c.hidden_size, c.hidden_size, context_length, c.num_heads)
                  .num_kv_heads(c.num_kv_heads)
                  .rope(torchattn::RoPEOptions(c.rope_theta))
                  .qkv_bias(c.qkv_bias)
                  .out_bias(c.o_bias)
                  .mask_buffer(false)
                  .init(random);
  attn.window(c.windows.at(static_cast<size_t>(layer)));
  if (c.own_head_dim > 0) attn.head_dim(c.own_head_dim);
  if (c.qk_norm) attn.qk_norm(torchattn::QKNormOptions().eps(c.rms_norm_eps));
  if (c.attn_softcap > 0.0) attn.softcap(c.attn_softcap);
  if (c.attn_scale) attn.scale(c.attn_scale);
  self_attn = register_module("self_attn", torchattn::MultiHeadAttention(attn));
  post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps, gemma));
  if (gemma) {
    pre_feedforward_layernorm = register_module("pre_feedforward_layernorm",
                                                RMSNorm(c.hidden_size, c.rms_norm_eps, true));
    post_feedforward_layernorm = register_module("post_feedforward_layernorm",
                                                 RMSNorm(c.hidden_size, c.rms_norm_eps, true));
  }
  const auto mlp = [&](int64_t in, int64_t out) {
    return torchattn::LinearOptions(in, out).bias(c.mlp_bias).init(random);
  };
  gate_proj = register_module("gate_proj", torchattn::Linear(mlp(c.hidden_size, c.intermediate_size)));
  up_proj = register_module("up_proj", torchattn::Linear(mlp(c.hidden_size, c.intermediate_size)));
  down_proj = register_module("down_proj", torchattn::Linear(mlp(c.intermediate_size, c.hidden_size)));
}

void DecoderLayerImpl::pack_weights(bool on, int64_t min_rows) {
  TORCH_CHECK(min_rows >= 1, "DecoderLayer: expected pack_weights' min_rows >= 1, got ", min_rows);
  self_attn->options.projections().pack = {.on = on, .min_rows = min_rows};
  for (auto* l : {&gate_proj, &up_proj, &down_proj}) (*l)->set_inference({.on = on, .min_rows = min_rows});
}

void DecoderLayerImpl::freeze_weights(torchattn::WeightFormat format) {
  torchattn::check_weight_format(format, "DecoderLayer::freeze_weights: format");
  self_attn->options.projections().format = format;
  self_attn->options.projections().int8_inputs = torchattn::Int8Inputs::Quantized;
  self_attn->freeze_weights();
  for (auto* l : {&gate_proj, &up_proj, &down_proj}) (*l)->freeze(format, torchattn::Int8Inputs::Quantized);
}

namespace {

// A layer's linear layers by their names under it, in frozen_state's order.
constexpr const char* kLayerLinears[] = {"self_attn.W_query",  "self_attn.W_key", "self_attn.W_value",
                                         "self_attn.out_proj", "gate_proj",       "up_proj",
                                         "down_proj"};

std::vector<torchattn::Linear> linears_of(const DecoderLayerImpl& l) {
  const auto& a = l.self_attn;
  return {a->W_query, a->W_key, a->W_value, a->out_proj, l.gate_proj, l.up_proj, l.down_proj};
}

// The frozen weights of `layer` under `name` ("<name>.weight", and its scale) into `out`.
void append_linear(torchattn::NamedTensors& out, const std::string& name, const torchattn::Linear& layer) {
  auto [data, scale] = layer->frozen_weight();
  out.emplace_back(name + ".weight", data);
  if (scale.defined()) out.emplace_back(name + ".weight" + torchattn::kFrozenScaleSuffix, scale);
}

// The format of the output head of a model frozen to `format`: Int8 for Int4 (the head
// decides every token: a file's Q8_0 table requantized to int4 raised SmolLM2-135M's
// perplexity from 43.93 to 45.94), else the same.
torchattn::WeightFormat head_format(torchattn::WeightFormat format) {
  return format == torchattn::WeightFormat::Int4 ? torchattn::WeightFormat::Int8 : format;
}

// `layer` bound to the frozen weights under `name` in `weights` (checked before).
void bind_linear(torchattn::Linear& layer, torchattn::WeightFormat format,
                 const std::map<std::string, at::Tensor>& weights, const std::string& name) {
  const std::string w = name + ".weight";
  const auto scale = weights.find(w + torchattn::kFrozenScaleSuffix);
  layer->bind(format, weights.at(w), scale != weights.end() ? scale->second : at::Tensor(),
              torchattn::Int8Inputs::Quantized, w);
}

}  // namespace

std::vector<std::string> DecoderLayerImpl::check_frozen(torchattn::WeightFormat format,
                                                        const std::map<std::string, at::Tensor>& weights,
                                                        const std::string& prefix) const {
  torchattn::check_weight_format(format, "DecoderLayer::check_frozen: format");
  const auto linears = linears_of(*this);
  std::vector<std::string> names;
  for (size_t i = 0; i < linears.size(); ++i) {
    const std::string name = std::string(kLayerLinears[i]) + ".weight";
    torchattn::check_frozen_weights(format, weights, prefix, {name}, {linears[i]->weight}, "CausalLM");
    names.push_back(prefix + name);
    if (format == torchattn::WeightFormat::Int8 || format == torchattn::WeightFormat::Int4) {
      names.push_back(prefix + name + torchattn::kFrozenScaleSuffix);
    }
  }
  return names;
}

void DecoderLayerImpl::freeze_weights(torchattn::WeightFormat format, const std::map<std::string, at::Tensor>& weights,
                                      const std::string& prefix) {
  torchattn::LinearInference& projections = self_attn->options.projections();
  projections.pack.on = true;
  projections.format = format;
  projections.int8_inputs = torchattn::Int8Inputs::Quantized;
  auto linears = linears_of(*this);
  for (size_t i = 0; i < linears.size(); ++i) bind_linear(linears[i], format, weights, prefix + kLayerLinears[i]);
}

void DecoderLayerImpl::append_frozen(torchattn::NamedTensors& out, const std::string& prefix) const {
  const auto linears = linears_of(*this);
  for (size_t i = 0; i < linears.size(); ++i) append_linear(out, prefix + kLayerLinears[i], linears[i]);
}

int64_t DecoderLayerImpl::frozen_bytes() const {
  if (!down_proj->frozen()) return 0;
  int64_t bytes = 0;
  for (const auto& l : linears_of(*this)) bytes += l->format_bytes();
  return bytes;
}

at::Tensor DecoderLayerImpl::forward_paged(const at::Tensor& x, torchattn::PagedKVCache& cache,
                                           const torchattn::PagedStep& step, int64_t layer) {
  return rest(self_attn->forward_paged(input_layernorm(x), cache, step, layer), x);
}

at::Tensor DecoderLayerImpl::forward_packed(const at::Tensor& x, const at::Tensor& cu_seqlens) {
  return rest(self_attn->forward_packed(input_layernorm(x), cu_seqlens), x);
}

at::Tensor DecoderLayerImpl::rest(const at::Tensor& attn, const at::Tensor& x) {
  // Residual sums written in place where no gradient is kept (generation, and
  // forward_paged, which refuses autograd): the same values, one allocation fewer each.
  const bool in_place = !c10::GradMode::is_enabled();
  if (!pre_feedforward_layernorm) {  // the Llama family: x + attn, then h + mlp(norm(h))
    const at::Tensor h = in_place ? attn.add_(x) : attn + x;
    const at::Tensor out = mlp(post_attention_layernorm(h));
    return in_place ? out.add_(h) : out + h;
  }
  // Gemma 2: each sublayer's output normed before its residual sum.
  at::Tensor h = post_attention_layernorm(attn);
  h = in_place ? h.add_(x) : h + x;
  const at::Tensor out = post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)));
  return in_place ? out.add_(h) : out + h;
}

at::Tensor DecoderLayerImpl::activate(at::Tensor gate, bool in_place) const {
  if (gelu_tanh_) return in_place ? at::gelu_(gate, "tanh") : at::gelu(gate, "tanh");
  return in_place ? at::silu_(gate) : at::silu(gate);
}

at::Tensor DecoderLayerImpl::mlp(const at::Tensor& m) {
  const bool in_place = !c10::GradMode::is_enabled();
  // gate_proj and up_proj read m together (frozen: one product), then SiLU(gate) * up.
  auto gate_up = torchattn::linear_group(m, {gate_proj.get(), up_proj.get()}, /*fast=*/true);
  at::Tensor gate = std::move(gate_up[0]);
  gate = in_place ? activate(gate, true).mul_(gate_up[1]) : activate(gate, false) * gate_up[1];
  return down_proj->forward_fast(gate);
}

at::Tensor DecoderLayerImpl::forward(const at::Tensor& x, torchattn::KVCache* cache,
                                     const at::Tensor& key_padding_mask) {
  const at::Tensor a = input_layernorm(x);
  return rest(cache != nullptr ? self_attn->forward_cached(a, *cache, key_padding_mask)
                               : self_attn->forward(a, key_padding_mask),
              x);
}

CausalLMImpl::CausalLMImpl(const DecoderConfig& config, int64_t context_length)
    : CausalLMImpl(config, context_length, Init::Random) {}

CausalLMImpl::CausalLMImpl(const DecoderConfig& config, int64_t context_length, torchattn::WeightFormat frozen)
    : CausalLMImpl(config, context_length, Init::ForLoading) {
  torchattn::check_weight_format(frozen, "CausalLM(config, context_length, frozen): frozen");
  TORCH_CHECK(
      frozen != torchattn::WeightFormat::DynamicInt8,
      "CausalLM: a model built for frozen weights takes bfloat16, int8 or int4 (load_frozen_state), got dynamic-int8 ",
      "(quantized from float32 weights: build a float32 model, load it, then freeze_weights)");
}

CausalLMImpl::CausalLMImpl(const DecoderConfig& config, int64_t context_length, Init init)
    : config_(config), context_length_(context_length) {
  TORCH_CHECK(context_length > 0 && context_length <= config.max_position_embeddings,
              "CausalLM: expected a context_length in [1, max_position_embeddings=", config.max_position_embeddings,
              "], got ", context_length);
  check_init(init, "CausalLM(config, context_length, init)");
  const bool random = init == Init::Random;
  auto table = torch::nn::EmbeddingOptions(config.vocab_size, config.hidden_size);
  // Built for loading: a placeholder table of its shape (no memory, nothing drawn).
  if (!random) table._weight(torchattn::placeholder({config.vocab_size, config.hidden_size}));
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(table));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_layers; ++i) layers->push_back(DecoderLayer(config, i, context_length, init));
  norm = register_module("norm", RMSNorm(config.hidden_size, config.rms_norm_eps, config.gemma_norms));
  auto head = torchattn::LinearOptions(config.hidden_size, config.vocab_size).bias(false);
  if (!config.tie_word_embeddings) {
    lm_head = register_module("lm_head", torchattn::Linear(torchattn::LinearOptions(head).init(random)));
  } else {
    // The tied head reads embed_tokens' own parameter (one tensor: loading, .to() and
    // freezing reach both).
    tied_head_ = torchattn::Linear(torchattn::LinearOptions(head).init(false));
    tied_head_->weight = embed_tokens->weight;
  }
}

void CausalLMImpl::pack_weights(bool on, int64_t min_rows) {
  TORCH_CHECK(min_rows >= 1, "CausalLM: expected pack_weights' min_rows >= 1, got ", min_rows);
  pack_ = {.on = on, .min_rows = min_rows};
  for (const auto& layer : *layers) layer->as<DecoderLayerImpl>()->pack_weights(on, min_rows);
  // The packed head is faster even for one row (a vocabulary's worth of outputs).
  output_head()->set_inference({.on = on, .min_rows = 1});
}

namespace {

void check_frozen_move(const CausalLMImpl& model, const std::optional<torch::Device>& device,
                       const std::optional<torch::Dtype>& dtype) {
  const torchattn::WeightFormat format = model.weight_format();
  if (format == torchattn::WeightFormat::Float32) return;
  const bool stays = (!device || device->is_cpu()) && (!dtype || *dtype == at::kFloat);
  std::string asked;
  if (device) asked += device->str();
  if (dtype) asked += (asked.empty() ? "" : ", ") + std::string(c10::toString(*dtype));
  TORCH_CHECK(stays, "CausalLM: to(", asked, "): the model's weights are frozen in ", torchattn::to_string(format),
              " (freeze_weights), which runs on the CPU with float32 activations; load the model again without "
              "LoadOptions::weight_format to move it");
}

}  // namespace

void CausalLMImpl::place_projections_together() {
  for (const auto& layer : *layers) {
    auto* l = layer->as<DecoderLayerImpl>();
    torchattn::place_together({l->self_attn->W_query.get(), l->self_attn->W_key.get(), l->self_attn->W_value.get()});
    torchattn::place_together({l->gate_proj.get(), l->up_proj.get()});
  }
}

void CausalLMImpl::placed_after_move() {
  if (!embed_tokens->weight.is_cpu() && weight_format() == torchattn::WeightFormat::Float32) {
    place_projections_together();
  }
}

void CausalLMImpl::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  check_frozen_move(*this, device, dtype);
  torch::nn::Module::to(device, dtype, non_blocking);
  placed_after_move();
}

void CausalLMImpl::to(torch::Dtype dtype, bool non_blocking) {
  check_frozen_move(*this, std::nullopt, dtype);
  torch::nn::Module::to(dtype, non_blocking);
  placed_after_move();
}

void CausalLMImpl::to(torch::Device device, bool non_blocking) {
  check_frozen_move(*this, device, std::nullopt);
  torch::nn::Module::to(device, non_blocking);
  placed_after_move();
}

void CausalLMImpl::freeze_weights(torchattn::WeightFormat format) {
  torchattn::check_weight_format(format, "CausalLM: freeze_weights");
  TORCH_CHECK(format != torchattn::WeightFormat::Float32,
              "CausalLM: freeze_weights keeps bfloat16, int8, int4 or dynamic-int8 weights, got float32");
  TORCH_CHECK(weight_format() == torchattn::WeightFormat::Float32 || weight_format() == format,
              "CausalLM: freeze_weights: the weights are already ", torchattn::to_string(weight_format()),
              ", asked for ", torchattn::to_string(format));
  if (output_head()->frozen()) return;
  const at::Tensor& weight = output_head()->weight;
  TORCH_CHECK(weight.is_cpu() && weight.scalar_type() == at::kFloat,
              "CausalLM: freeze_weights needs a float32 model on "
              "the CPU, got weights of ",
              weight.scalar_type(), " on ", weight.device());
  // Layer by layer: each layer's float32 weights go as soon as its own format is made.
  for (const auto& layer : *layers) layer->as<DecoderLayerImpl>()->freeze_weights(format);
  // quantize_dynamic leaves nn.Embedding alone: a tied table stays float32 for the
  // lookup, and the head freezes a handle of its own to the same memory.
  if (!lm_head && format == torchattn::WeightFormat::DynamicInt8) tied_head_->weight = embed_tokens->weight.detach();
  output_head()->freeze(head_format(format), torchattn::Int8Inputs::Quantized);
}

torchattn::WeightFormat CausalLMImpl::weight_format() const {
  if (!output_head()->frozen()) return torchattn::WeightFormat::Float32;
  const torchattn::WeightFormat head = output_head()->weight_format();
  // The layers' format: the head's but where an Int4 model's head is Int8.
  if (head == torchattn::WeightFormat::Int8 && !layers->is_empty() &&
      layers->at<DecoderLayerImpl>(0).gate_proj->weight_format() == torchattn::WeightFormat::Int4) {
    return torchattn::WeightFormat::Int4;
  }
  return head;
}

torchattn::NamedTensors CausalLMImpl::frozen_state() const {
  TORCH_CHECK(output_head()->frozen(), "CausalLM: frozen_state needs freeze_weights first (the weights are float32)");
  TORCH_CHECK(weight_format() != torchattn::WeightFormat::DynamicInt8, "CausalLM: frozen_state: dynamic-int8 weights ",
              "live in the quantized engine's packed form and are not saved (quantize at load, or freeze to int8)");
  torchattn::NamedTensors out;
  for (const auto& item : named_parameters()) {
    if (!torchattn::is_placeholder(item.value())) out.emplace_back(item.key(), item.value().detach());
  }
  for (size_t i = 0; i < layers->size(); ++i) {
    layers->at<DecoderLayerImpl>(i).append_frozen(out, "layers." + std::to_string(i) + ".");
  }
  append_linear(out, lm_head ? "lm_head" : "embed_tokens", output_head());
  return out;
}

void CausalLMImpl::load_frozen_state(torchattn::NamedTensors tensors, torchattn::WeightFormat format) {
  torchattn::check_weight_format(format, "CausalLM: load_frozen_state: format");
  TORCH_CHECK(format == torchattn::WeightFormat::BFloat16 || format == torchattn::WeightFormat::Int8 ||
                  format == torchattn::WeightFormat::Int4,
              "CausalLM: load_frozen_state takes bfloat16, int8 or int4 weights, got ", torchattn::to_string(format));
  TORCH_CHECK(!output_head()->frozen(), "CausalLM: load_frozen_state needs a model not yet frozen");
  const at::Tensor& head = output_head()->weight;
  TORCH_CHECK(head.is_cpu() && head.scalar_type() == at::kFloat,
              "CausalLM: load_frozen_state needs a float32 model on the CPU, got weights of ", head.scalar_type(),
              " on ", head.device());
  std::map<std::string, at::Tensor> by_name;
  for (auto& [name, t] : tensors) {
    TORCH_CHECK(by_name.emplace(name, std::move(t)).second, "CausalLM: load_frozen_state: '", name, "' appears twice");
  }
  tensors.clear();  // by_name holds the only handles: each goes once used
  // Everything checked before anything changes.
  std::set<std::string> expected;
  for (size_t i = 0; i < layers->size(); ++i) {
    const auto names = layers[i]->as<DecoderLayerImpl>()->check_frozen(format, by_name,
                                                                       "layers." + std::to_string(i) + ".");
    expected.insert(names.begin(), names.end());
  }
  const std::string head_name = lm_head ? "lm_head" : "embed_tokens";
  torchattn::check_frozen_weights(head_format(format), by_name, "", {head_name + ".weight"}, {head}, "CausalLM");
  expected.insert(head_name + ".weight");
  if (format == torchattn::WeightFormat::Int8 || format == torchattn::WeightFormat::Int4) {
    expected.insert(head_name + ".weight" + torchattn::kFrozenScaleSuffix);
  }
  std::vector<std::pair<at::Tensor, at::Tensor>> values;  // (parameter, its float32 tensor)
  for (const auto& item : named_parameters()) {
    if (expected.count(item.key()) > 0) continue;
    const auto it = by_name.find(item.key());
    TORCH_CHECK(it != by_name.end(), "CausalLM: load_frozen_state: no '", item.key(), "' (", item.value().sizes(),
                " float32)");
    TORCH_CHECK(it->second.scalar_type() == at::kFloat && it->second.sizes() == item.value().sizes(),
                "CausalLM: load_frozen_state: expected '", item.key(), "' float32 ", item.value().sizes(), ", got ",
                it->second.scalar_type(), " ", it->second.sizes(), " (weights of another model?)");
    expected.insert(item.key());
    values.emplace_back(item.value(), it->second);
  }
  for (const auto& [name, t] : by_name) {
    TORCH_CHECK(expected.count(name) > 0, "CausalLM: load_frozen_state: unexpected '", name, "' ", t.sizes(),
                " (weights of another model?)");
  }
  {
    // The file's own tensors where they are dense (views of its mapping: nothing copied).
    torch::NoGradGuard no_grad;
    for (auto& [param, t] : values) param.set_data(t.is_contiguous() ? t : t.contiguous());
  }
  values.clear();
  for (size_t i = 0; i < layers->size(); ++i) {
    layers[i]->as<DecoderLayerImpl>()->freeze_weights(format, by_name, "layers." + std::to_string(i) + ".");
  }
  bind_linear(lm_head ? lm_head : tied_head_, head_format(format), by_name, head_name);
}

int64_t CausalLMImpl::weight_bytes() const {
  int64_t bytes = 0;
  for (const auto& p : parameters()) {
    bytes += torchattn::is_placeholder(p) ? 0 : p.numel() * static_cast<int64_t>(p.element_size());
  }
  for (const auto& layer : *layers) bytes += layer->as<DecoderLayerImpl>()->frozen_bytes();
  return bytes + (output_head()->frozen() ? output_head()->format_bytes() : 0);
}

WeightsOptions CausalLMImpl::hf_weights() const {
  std::vector<std::string> ignore{"rotary_emb.inv_freq"};
  if (config_.tie_word_embeddings) ignore.emplace_back("lm_head.weight");  // a tied head saved anyway
  return WeightsOptions()
      .rename({{"model", ""},
               {"mlp", ""},
               {"q_proj", "W_query"},
               {"k_proj", "W_key"},
               {"v_proj", "W_value"},
               {"o_proj", "out_proj"}})
      .ignore(ignore);
}

void CausalLMImpl::load_hf_weights(const std::string& path) {
  TORCH_CHECK(!output_head()->frozen(),
              "CausalLM: load_hf_weights needs float32 weights to load into; freeze_weights (",
              torchattn::to_string(weight_format()), ") freed them");
  // A folder of frozen weights (its model.safetensors, or the folder) holds int8 or
  // bfloat16 tensors under the checkpoint's names: named here, not as a dtype the
  // generic loader meets in its first tensor.
  namespace fs = std::filesystem;
  const fs::path given(path);
  const fs::path folder = fs::is_directory(given) ? given : given.parent_path();
  const bool saved = fs::exists(folder / kSavedWeightsFile) &&
                     (fs::is_directory(given) || given.filename() == "model.safetensors");
  TORCH_CHECK(!saved, "CausalLM: load_hf_weights: '", path, "' is a folder of frozen weights that torchattn saved (",
              (folder / kSavedWeightsFile).string(),
              "), not a Hugging Face checkpoint of float32 weights; load it with LanguageModel::from_pretrained or "
              "models::load_causal_lm (include/torchattn/models/saved_folder.h)");
  load_weights(*this, path, hf_weights());
}

void CausalLMImpl::load_hf_tensors(const torchattn::NamedTensors& tensors, const std::string& source) {
  TORCH_CHECK(!output_head()->frozen(),
              "CausalLM: load_hf_tensors needs float32 weights to load into; freeze_weights (",
              torchattn::to_string(weight_format()), ") freed them");
  load_weights(*this, tensors, hf_weights(), source);
}

std::vector<torchattn::KVCache> CausalLMImpl::make_kv_caches(int64_t batch, bool static_shapes,
                                                             int64_t capacity) const {
  std::vector<torchattn::KVCache> caches;
  for (const auto& layer : *layers) {
    caches.push_back(layer->as<DecoderLayerImpl>()->self_attn->make_kv_cache(batch, static_shapes, capacity));
  }
  return caches;
}

torchattn::PagedKVCache CausalLMImpl::make_paged_kv_cache(const torchattn::PagedKVCacheOptions& options) const {
  std::vector<torchattn::PagedLayer> specs;
  for (const auto& layer : *layers) specs.push_back(layer->as<DecoderLayerImpl>()->self_attn->paged_layer());
  return torchattn::PagedKVCache(std::move(specs), options);
}

at::Tensor CausalLMImpl::forward_paged(const at::Tensor& ids, torchattn::PagedKVCache& cache,
                                       const torchattn::PagedStep& step, const at::Tensor& logit_rows) {
  TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == at::kLong,
              "CausalLM: forward_paged expected int64 ids [N] (the "
              "step's tokens packed), got ",
              ids.sizes(), " of ", ids.scalar_type());
  TORCH_CHECK(cache.num_layers() == static_cast<int64_t>(layers->size()), "CausalLM: expected a paged cache of ",
              layers->size(), " layers (make_paged_kv_cache), got one of ", cache.num_layers());
  TORCH_CHECK(!logit_rows.defined() || (logit_rows.dim() == 1 && logit_rows.scalar_type() == at::kLong),
              "CausalLM: "
              "expected logit_rows as int64 indices [R], got ",
              logit_rows.sizes(), " of ", logit_rows.scalar_type());
  at::Tensor x = embed(ids);
  for (size_t i = 0; i < layers->size(); ++i) {
    x = layers[i]->as<DecoderLayerImpl>()->forward_paged(x, cache, step, static_cast<int64_t>(i));
  }
  if (logit_rows.defined()) x = x.index_select(0, logit_rows.to(x.device()));
  return head(norm(x));
}

at::Tensor CausalLMImpl::forward_packed(const at::Tensor& ids, const at::Tensor& cu_seqlens) {
  TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == at::kLong, "CausalLM: forward_packed expected int64 ids [N], got ",
              ids.sizes(), " of ", ids.scalar_type());
  TORCH_CHECK(cu_seqlens.defined(), "CausalLM: forward_packed expected cu_seqlens, got an undefined tensor");
  // On the host once: every layer reads it (each checks it, naming its module).
  const at::Tensor cu = cu_seqlens.to(at::kCPU);
  at::Tensor x = embed(ids);
  for (size_t i = 0; i < layers->size(); ++i) {
    x = layers[i]->as<DecoderLayerImpl>()->forward_packed(x, cu);
  }
  return head(norm(x));
}

namespace {

// cu_seqlens as "[0, 3, 7]" for a message (the first 16 values, then how many more).
std::string offsets_text(const int64_t* c, int64_t n) {
  std::string out = "[";
  for (int64_t i = 0; i < std::min<int64_t>(n, 16); ++i) out += (i ? ", " : "") + std::to_string(c[i]);
  if (n > 16) out += ", ... (" + std::to_string(n) + " values)";
  return out + "]";
}

// The first id of CPU `ids` outside [0, limit), and its index ("i, j" for 2-D ids);
// none when all are inside, or when the ids are on a device (checking there would wait
// for it).
std::optional<std::pair<int64_t, std::string>> id_out_of_range(const at::Tensor& ids, int64_t limit) {
  if (!ids.is_cpu() || ids.numel() == 0) return std::nullopt;
  const auto [low, high] = at::aminmax(ids);
  const int64_t lo = low.item<int64_t>(), hi = high.item<int64_t>();
  if (lo >= 0 && hi < limit) return std::nullopt;
  const int64_t bad = lo < 0 ? lo : hi;
  const at::Tensor where = ids.eq(bad).nonzero()[0];
  std::string at_index;
  for (int64_t d = 0; d < where.numel(); ++d) at_index += (d ? ", " : "") + std::to_string(where[d].item<int64_t>());
  return std::make_pair(bad, at_index);
}

}  // namespace

at::Tensor packed_next_token_loss(const at::Tensor& logits, const at::Tensor& ids, const at::Tensor& cu_seqlens) {
  TORCH_CHECK(logits.dim() == 2 && ids.dim() == 1 && logits.size(0) == ids.size(0),
              "packed_next_token_loss: expected logits [N, vocab] and ids [N], got ", logits.sizes(), " and ",
              ids.sizes());
  TORCH_CHECK(at::isFloatingType(logits.scalar_type()),
              "packed_next_token_loss: expected floating logits (the model's output), got ", logits.scalar_type());
  TORCH_CHECK(cu_seqlens.defined(), "packed_next_token_loss: expected cu_seqlens [S + 1] int32 or int64, got an "
                                    "undefined tensor");
  TORCH_CHECK(cu_seqlens.dim() == 1 && (cu_seqlens.scalar_type() == at::kInt || cu_seqlens.scalar_type() == at::kLong),
              "packed_next_token_loss: expected cu_seqlens [S + 1] int32 or int64, got ", cu_seqlens.scalar_type(), " ",
              cu_seqlens.sizes());
  TORCH_CHECK(ids.scalar_type() == at::kLong || ids.scalar_type() == at::kInt,
              "packed_next_token_loss: expected ids int64 or int32 (token ids), got ", ids.scalar_type());
  // Not left to cross_entropy's "Target ... is out of bounds".
  if (const auto bad = id_out_of_range(ids, logits.size(1))) {
    TORCH_CHECK(false, "packed_next_token_loss: expected ids in [0, ", logits.size(1),
                ") (the logits' vocabulary), got ", bad->first, " at [", bad->second, "] of the ids ", ids.sizes());
  }
  const at::Tensor cu = cu_seqlens.to(at::kCPU, at::kLong).contiguous();
  const int64_t* c = cu.const_data_ptr<int64_t>();
  const int64_t N = ids.size(0);
  TORCH_CHECK(cu.numel() >= 2 && c[0] == 0 && c[cu.numel() - 1] == N,
              "packed_next_token_loss: expected cu_seqlens from 0 to the ", N, " tokens, got ",
              offsets_text(c, cu.numel()));
  // Rows that predict a token of their own document: all but each document's last.
  std::vector<int64_t> rows;
  rows.reserve(static_cast<size_t>(N));
  for (int64_t s = 0; s + 1 < cu.numel(); ++s) {
    TORCH_CHECK(c[s + 1] > c[s], "packed_next_token_loss: expected cu_seqlens increasing, got ",
                offsets_text(c, cu.numel()));
    for (int64_t i = c[s]; i + 1 < c[s + 1]; ++i) rows.push_back(i);
  }
  TORCH_CHECK(!rows.empty(), "packed_next_token_loss: expected a document of two tokens or more, got cu_seqlens ",
              offsets_text(c, cu.numel()));
  const at::Tensor from = at::tensor(rows, at::kLong).to(logits.device());
  // Half-precision logits summed in float32, as transformers' loss upcasts them.
  at::Tensor picked = logits.index_select(0, from);
  if (picked.scalar_type() == at::kHalf || picked.scalar_type() == at::kBFloat16) picked = picked.to(at::kFloat);
  return at::cross_entropy_loss(picked, ids.index_select(0, from + 1).to(at::kLong));
}

at::Tensor CausalLMImpl::embed(const at::Tensor& ids) {
  // CPU ids are checked here (a reduction over a few ids), not left to the embedding's
  // "index out of range in self"; on CUDA that check would wait for the device at every
  // step.
  if (const auto bad = id_out_of_range(ids, config_.vocab_size)) {
    TORCH_CHECK(false, "CausalLM: expected token ids in [0, ", config_.vocab_size, ") (the config's vocab_size), got ",
                bad->first, " at [", bad->second, "] of the ids ", ids.sizes());
  }
  at::Tensor x;
  if (!torchattn::is_placeholder(embed_tokens->weight)) {
    x = embed_tokens(ids);
  } else {
    // A tied head frozen to bfloat16/int8 holds the only copy of the table.
    TORCH_CHECK(!lm_head && tied_head_->frozen(),
                "CausalLM: forward before the weights were loaded (built with Init::ForLoading: load_hf_weights or "
                "load_frozen_state first)");
    x = tied_head_->weight_rows(ids);
  }
  if (!config_.gemma_norms) return x;
  // Gemma 2: times sqrt(hidden_size) rounded to the embeddings' dtype, as transformers.
  return x * at::scalar_tensor(std::sqrt(static_cast<double>(config_.hidden_size)), x.options());
}

at::Tensor CausalLMImpl::head(const at::Tensor& x) {
  at::Tensor logits = output_head()->forward_fast(x);
  if (config_.final_softcap > 0.0) {  // Gemma 2: cap * tanh(logits / cap)
    logits = at::tanh(logits / config_.final_softcap) * config_.final_softcap;
  }
  return logits;
}

at::Tensor CausalLMImpl::forward(const at::Tensor& ids, std::vector<torchattn::KVCache>* caches,
                                 const at::Tensor& key_padding_mask, bool last_only) {
  TORCH_CHECK(ids.dim() == 2 && ids.scalar_type() == at::kLong, "CausalLM: expected int64 ids [B, T], got ",
              ids.sizes(), " of ", ids.scalar_type());
  TORCH_CHECK(caches == nullptr || caches->size() == layers->size(), "CausalLM: expected ", layers->size(),
              " caches, got ", caches == nullptr ? 0 : caches->size());
  at::Tensor x = embed(ids);
  for (size_t i = 0; i < layers->size(); ++i) {
    x = layers[i]->as<DecoderLayerImpl>()->forward(x, caches != nullptr ? &(*caches)[i] : nullptr, key_padding_mask);
  }
  if (last_only) {
    x = x.narrow(1, x.size(1) - 1, 1);
  }
  return head(norm(x));
}

}  // namespace torchattn::models

#include <torchattn/models/causal_lm.h>


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
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <cmath>
#include <map>
#include <set>
#include <utility>
#include <vector>

namespace torchattn::models {

DecoderLayerImpl::DecoderLayerImpl(const DecoderConfig& c, int64_t layer, int64_t context_length) {
  TORCH_CHECK(c.activation == "silu" || c.activation == "gelu_tanh",
              "DecoderLayer: expected the activation silu or "
              "gelu_tanh, got '",
              c.activation, "'");
  gelu_tanh_ = c.activation == "gelu_tanh";
  const bool gemma = c.gemma_norms;
  input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps, gemma));
  auto attn = torchattn::MultiHeadAttentionOptions(c.hidden_size, c.hidden_size, context_length, c.num_heads)
                  .num_kv_heads(c.num_kv_heads)
                  .rope(torchattn::RoPEOptions(c.rope_theta))
                  .qkv_bias(c.qkv_bias)
                  .out_bias(c.o_bias)
                  .mask_buffer(false);
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
  const auto mlp = [&](int64_t in, int64_t out) { return torch::nn::LinearOptions(in, out).bias(c.mlp_bias); };
  gate_proj = register_module("gate_proj", torch::nn::Linear(mlp(c.hidden_size, c.intermediate_size)));
  up_proj = register_module("up_proj", torch::nn::Linear(mlp(c.hidden_size, c.intermediate_size)));
  down_proj = register_module("down_proj", torch::nn::Linear(mlp(c.intermediate_size, c.hidden_size)));
  packed_gate_up_ = std::make_shared<torchattn::PackedLinear>();
  packed_down_ = std::make_shared<torchattn::PackedLinear>();
}

void DecoderLayerImpl::pack_weights(bool on, int64_t min_rows) {
  TORCH_CHECK(min_rows >= 1, "DecoderLayer: expected pack_weights' min_rows >= 1, got ", min_rows);
  pack_ = {.on = on, .min_rows = min_rows};
  self_attn->options.pack_weights(on).pack_min_rows(min_rows);
  if (!on) {
    packed_gate_up_->clear();
    packed_down_->clear();
  }
}

void DecoderLayerImpl::freeze_weights(torchattn::WeightFormat format) {
  self_attn->options.weight_format(format).int8_inputs(torchattn::Int8Inputs::Quantized);
  self_attn->freeze_weights();
  packed_gate_up_ = std::make_shared<torchattn::PackedLinear>(format, torchattn::Int8Inputs::Quantized);
  packed_down_ = std::make_shared<torchattn::PackedLinear>(format, torchattn::Int8Inputs::Quantized);
  packed_gate_up_->freeze({gate_proj->weight, up_proj->weight}, {gate_proj->bias, up_proj->bias});
  packed_down_->freeze({down_proj->weight}, {down_proj->bias});
  for (const auto* l : {&gate_proj, &up_proj, &down_proj}) torchattn::PackedLinear::release((*l)->weight);
}

namespace {

// The MLP's frozen weights, each PackedLinear's in freeze's order.
const std::vector<std::string>& gate_up_names() {
  static const std::vector<std::string> names{"gate_proj.weight", "up_proj.weight"};
  return names;
}
const std::vector<std::string>& down_names() {
  static const std::vector<std::string> names{"down_proj.weight"};
  return names;
}

// A layer's frozen linear weights, as (the prefix under the layer, their names).
const std::vector<std::pair<std::string, std::vector<std::string>>>& layer_linears() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> groups{
      {"self_attn.", {"W_query.weight", "W_key.weight", "W_value.weight"}},
      {"self_attn.", {"out_proj.weight"}},
      {"", gate_up_names()},
      {"", down_names()}};
  return groups;
}

// A weight freed by PackedLinear::release: a stride-0 view of one element.
bool released(const at::Tensor& p) {
  return p.numel() > 0 && std::ranges::all_of(p.strides(), [](int64_t s) { return s == 0; });
}

}  // namespace

std::vector<std::string> DecoderLayerImpl::check_frozen(torchattn::WeightFormat format,
                                                        const std::map<std::string, at::Tensor>& weights,
                                                        const std::string& prefix) const {
  const std::vector<std::vector<at::Tensor>> like{{self_attn->W_query->weight, self_attn->W_key->weight,
                                                   self_attn->W_value->weight},
                                                  {self_attn->out_proj->weight},
                                                  {gate_proj->weight, up_proj->weight},
                                                  {down_proj->weight}};
  std::vector<std::string> names;
  for (size_t g = 0; g < like.size(); ++g) {
    const auto& [sub, group] = layer_linears()[g];
    const std::string under = prefix + sub;
    torchattn::check_frozen_weights(format, weights, under, group, like[g], "CausalLM");
    for (const auto& n : group) {
      std::string name = under;
      name += n;
      names.push_back(name);
      if (format == torchattn::WeightFormat::Int8) names.push_back(name.append(torchattn::kFrozenScaleSuffix));
    }
  }
  return names;
}

void DecoderLayerImpl::freeze_weights(torchattn::WeightFormat format, const std::map<std::string, at::Tensor>& weights,
                                      const std::string& prefix) {
  self_attn->options.weight_format(format).int8_inputs(torchattn::Int8Inputs::Quantized);
  self_attn->freeze_weights(weights, prefix + "self_attn.");
  packed_gate_up_ = std::make_shared<torchattn::PackedLinear>(format, torchattn::Int8Inputs::Quantized);
  packed_down_ = std::make_shared<torchattn::PackedLinear>(format, torchattn::Int8Inputs::Quantized);
  torchattn::freeze_from_weights(*packed_gate_up_, weights, prefix, gate_up_names(),
                                 {gate_proj->weight, up_proj->weight}, {gate_proj->bias, up_proj->bias}, "CausalLM");
  torchattn::freeze_from_weights(*packed_down_, weights, prefix, down_names(), {down_proj->weight}, {down_proj->bias},
                                 "CausalLM");
  for (const auto* l : {&gate_proj, &up_proj, &down_proj}) torchattn::PackedLinear::release((*l)->weight);
}

void DecoderLayerImpl::append_frozen(torchattn::NamedTensors& out, const std::string& prefix) const {
  const std::string attn = prefix + "self_attn.";
  for (const auto& [name, t] : self_attn->frozen_state()) out.emplace_back(attn + name, t);
  torchattn::append_frozen_weights(out, prefix, gate_up_names(), *packed_gate_up_);
  torchattn::append_frozen_weights(out, prefix, down_names(), *packed_down_);
}

int64_t DecoderLayerImpl::frozen_bytes() const {
  if (!packed_down_->frozen()) return 0;
  return self_attn->packed_bytes() + packed_gate_up_->packed_bytes() + packed_down_->packed_bytes();
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
  at::Tensor gate;
  if (pack_.routes(packed_gate_up_.get(), m, {gate_proj->weight, up_proj->weight}, {gate_proj->bias, up_proj->bias})) {
    // gate_proj | up_proj in one product, then SiLU(gate) * up in place on its first half.
    const at::Tensor both = packed_gate_up_->forward(m, {gate_proj->weight, up_proj->weight},
                                                     {gate_proj->bias, up_proj->bias});
    const int64_t I = gate_proj->weight.size(0);
    gate = both.narrow(-1, 0, I);
    activate(gate, true).mul_(both.narrow(-1, I, I));
  } else {
    auto linear = [](const torch::nn::Linear& l, const at::Tensor& in) {
      return torchattn::functional::linear(in, l->weight, l->bias);
    };
    gate = linear(gate_proj, m);
    gate = in_place ? activate(gate, true).mul_(linear(up_proj, m)) : activate(gate, false) * linear(up_proj, m);
  }
  if (pack_.routes(packed_down_.get(), gate, {down_proj->weight}, {down_proj->bias})) {
    return packed_down_->forward(gate, {down_proj->weight}, {down_proj->bias});
  }
  return torchattn::functional::linear(gate, down_proj->weight, down_proj->bias);
}

at::Tensor DecoderLayerImpl::forward(const at::Tensor& x, torchattn::KVCache* cache,
                                     const at::Tensor& key_padding_mask) {
  const at::Tensor a = input_layernorm(x);
  return rest(cache != nullptr ? self_attn->forward_cached(a, *cache, key_padding_mask)
                               : self_attn->forward(a, key_padding_mask),
              x);
}

CausalLMImpl::CausalLMImpl(const DecoderConfig& config, int64_t context_length)
    : CausalLMImpl(config, context_length, torchattn::WeightFormat::Float32) {}

CausalLMImpl::CausalLMImpl(const DecoderConfig& config, int64_t context_length, torchattn::WeightFormat frozen)
    : config_(config), context_length_(context_length) {
  TORCH_CHECK(context_length > 0 && context_length <= config.max_position_embeddings,
              "CausalLM: expected a context_length in [1, max_position_embeddings=", config.max_position_embeddings,
              "], got ", context_length);
  TORCH_CHECK(
      frozen != torchattn::WeightFormat::DynamicInt8,
      "CausalLM: a model built for frozen weights takes bfloat16 or int8 (load_frozen_state), got dynamic-int8 ",
      "(quantized from float32 weights: build a float32 model, load it, then freeze_weights)");
  const bool release = frozen != torchattn::WeightFormat::Float32;
  // A table to be frozen (tied) or loaded: left unwritten, so its pages never become
  // resident before it is replaced.
  auto table = torch::nn::EmbeddingOptions(config.vocab_size, config.hidden_size);
  if (release) table._weight(at::empty({config.vocab_size, config.hidden_size}));
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(table));
  layers = register_module("layers", torch::nn::ModuleList());
  if (release && config.tie_word_embeddings) torchattn::PackedLinear::release(embed_tokens->weight);
  for (int64_t i = 0; i < config.num_layers; ++i) {
    DecoderLayer layer(config, i, context_length);
    if (release) {
      const auto& a = layer->self_attn;
      for (const auto& w : {a->W_query->weight, a->W_key->weight, a->W_value->weight, a->out_proj->weight,
                            layer->gate_proj->weight, layer->up_proj->weight, layer->down_proj->weight}) {
        torchattn::PackedLinear::release(w);
      }
#if defined(__GLIBC__)
      // glibc keeps the freed weights in its free lists and, measured here, does not
      // reuse them for the next layer's: a float32 model's worth of them stayed resident
      // (SmolLM2-135M: 399 MiB after building, 110 once trimmed). Give them back now.
      malloc_trim(0);
#endif
    }
    layers->push_back(layer);
  }
  norm = register_module("norm", RMSNorm(config.hidden_size, config.rms_norm_eps, config.gemma_norms));
  if (!config.tie_word_embeddings) {
    lm_head = register_module("lm_head",
                              torch::nn::Linear(
                                  torch::nn::LinearOptions(config.hidden_size, config.vocab_size).bias(false)));
  }
  if (release && lm_head) torchattn::PackedLinear::release(lm_head->weight);
  packed_head_ = std::make_shared<torchattn::PackedLinear>();
}

void CausalLMImpl::pack_weights(bool on, int64_t min_rows) {
  TORCH_CHECK(min_rows >= 1, "CausalLM: expected pack_weights' min_rows >= 1, got ", min_rows);
  pack_ = {.on = on, .min_rows = min_rows};
  for (const auto& layer : *layers) layer->as<DecoderLayerImpl>()->pack_weights(on, min_rows);
  if (!on) packed_head_->clear();
}

void CausalLMImpl::freeze_weights(torchattn::WeightFormat format) {
  TORCH_CHECK(format != torchattn::WeightFormat::Float32,
              "CausalLM: freeze_weights keeps bfloat16, int8 or dynamic-int8 weights, got float32");
  TORCH_CHECK(weight_format() == torchattn::WeightFormat::Float32 || weight_format() == format,
              "CausalLM: freeze_weights: the weights are already ", torchattn::to_string(weight_format()),
              ", asked for ", torchattn::to_string(format));
  if (packed_head_->frozen()) return;
  const at::Tensor& weight = lm_head ? lm_head->weight : embed_tokens->weight;
  TORCH_CHECK(weight.is_cpu() && weight.scalar_type() == at::kFloat,
              "CausalLM: freeze_weights needs a float32 model on "
              "the CPU, got weights of ",
              weight.scalar_type(), " on ", weight.device());
  for (const auto& layer : *layers) layer->as<DecoderLayerImpl>()->freeze_weights(format);
  packed_head_ = std::make_shared<torchattn::PackedLinear>(format, torchattn::Int8Inputs::Quantized);
  packed_head_->freeze({weight});
  // quantize_dynamic leaves nn.Embedding alone: a tied table stays float32 for the lookup.
  if (lm_head || format != torchattn::WeightFormat::DynamicInt8) torchattn::PackedLinear::release(weight);
}

torchattn::NamedTensors CausalLMImpl::frozen_state() const {
  TORCH_CHECK(packed_head_->frozen(), "CausalLM: frozen_state needs freeze_weights first (the weights are float32)");
  TORCH_CHECK(weight_format() != torchattn::WeightFormat::DynamicInt8, "CausalLM: frozen_state: dynamic-int8 weights ",
              "live in the quantized engine's packed form and are not saved (quantize at load, or freeze to int8)");
  torchattn::NamedTensors out;
  for (const auto& item : named_parameters()) {
    if (!released(item.value())) out.emplace_back(item.key(), item.value().detach());
  }
  for (size_t i = 0; i < layers->size(); ++i) {
    layers->at<DecoderLayerImpl>(i).append_frozen(out, "layers." + std::to_string(i) + ".");
  }
  torchattn::append_frozen_weights(out, "", {lm_head ? "lm_head.weight" : "embed_tokens.weight"}, *packed_head_);
  return out;
}

void CausalLMImpl::load_frozen_state(torchattn::NamedTensors tensors, torchattn::WeightFormat format) {
  TORCH_CHECK(format == torchattn::WeightFormat::BFloat16 || format == torchattn::WeightFormat::Int8,
              "CausalLM: load_frozen_state takes bfloat16 or int8 weights, got ", torchattn::to_string(format));
  TORCH_CHECK(!packed_head_->frozen(), "CausalLM: load_frozen_state needs a model not yet frozen");
  const at::Tensor& head = lm_head ? lm_head->weight : embed_tokens->weight;
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
  std::vector<std::vector<std::string>> layer_names;
  for (size_t i = 0; i < layers->size(); ++i) {
    layer_names.push_back(
        layers[i]->as<DecoderLayerImpl>()->check_frozen(format, by_name, "layers." + std::to_string(i) + "."));
    expected.insert(layer_names.back().begin(), layer_names.back().end());
  }
  const std::string head_name = lm_head ? "lm_head.weight" : "embed_tokens.weight";
  torchattn::check_frozen_weights(format, by_name, "", {head_name}, {head}, "CausalLM");
  expected.insert(head_name);
  if (format == torchattn::WeightFormat::Int8) expected.insert(head_name + torchattn::kFrozenScaleSuffix);
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // (parameter, its float32 tensor)
  for (const auto& item : named_parameters()) {
    if (expected.count(item.key()) > 0) continue;
    const auto it = by_name.find(item.key());
    TORCH_CHECK(it != by_name.end(), "CausalLM: load_frozen_state: no '", item.key(), "' (", item.value().sizes(),
                " float32)");
    TORCH_CHECK(it->second.scalar_type() == at::kFloat && it->second.sizes() == item.value().sizes(),
                "CausalLM: load_frozen_state: expected '", item.key(), "' float32 ", item.value().sizes(), ", got ",
                it->second.scalar_type(), " ", it->second.sizes(), " (weights of another model?)");
    expected.insert(item.key());
    copies.emplace_back(item.value(), it->second);
  }
  for (const auto& [name, t] : by_name) {
    TORCH_CHECK(expected.count(name) > 0, "CausalLM: load_frozen_state: unexpected '", name, "' ", t.sizes(),
                " (weights of another model?)");
  }
  {
    torch::NoGradGuard no_grad;
    for (auto& [param, t] : copies) param.copy_(t);
  }
  copies.clear();
  for (size_t i = 0; i < layers->size(); ++i) {
    layers[i]->as<DecoderLayerImpl>()->freeze_weights(format, by_name, "layers." + std::to_string(i) + ".");
    for (const auto& n : layer_names[i]) by_name.erase(n);
  }
  auto frozen_head = std::make_shared<torchattn::PackedLinear>(format, torchattn::Int8Inputs::Quantized);
  torchattn::freeze_from_weights(*frozen_head, by_name, "", {head_name}, {head}, {}, "CausalLM");
  packed_head_ = std::move(frozen_head);
  torchattn::PackedLinear::release(head);
}

int64_t CausalLMImpl::weight_bytes() const {
  int64_t bytes = 0;
  for (const auto& p : parameters()) {
    bytes += released(p) ? 0 : p.numel() * static_cast<int64_t>(p.element_size());
  }
  for (const auto& layer : *layers) bytes += layer->as<DecoderLayerImpl>()->frozen_bytes();
  return bytes + (packed_head_->frozen() ? packed_head_->packed_bytes() : 0);
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
  TORCH_CHECK(!packed_head_->frozen(), "CausalLM: load_hf_weights needs float32 weights to load into; freeze_weights (",
              torchattn::to_string(weight_format()), ") freed them");
  load_weights(*this, path, hf_weights());
}

std::vector<torchattn::KVCache> CausalLMImpl::make_kv_caches(int64_t batch, bool static_shapes) const {
  std::vector<torchattn::KVCache> caches;
  for (const auto& layer : *layers) {
    caches.push_back(layer->as<DecoderLayerImpl>()->self_attn->make_kv_cache(batch, static_shapes));
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

at::Tensor packed_next_token_loss(const at::Tensor& logits, const at::Tensor& ids, const at::Tensor& cu_seqlens) {
  TORCH_CHECK(logits.dim() == 2 && ids.dim() == 1 && logits.size(0) == ids.size(0),
              "packed_next_token_loss: expected logits [N, vocab] and ids [N], got ", logits.sizes(), " and ",
              ids.sizes());
  TORCH_CHECK(cu_seqlens.defined() && cu_seqlens.dim() == 1 &&
                  (cu_seqlens.scalar_type() == at::kInt || cu_seqlens.scalar_type() == at::kLong),
              "packed_next_token_loss: expected cu_seqlens [S + 1] int32 or int64");
  const at::Tensor cu = cu_seqlens.to(at::kCPU, at::kLong).contiguous();
  const int64_t* c = cu.const_data_ptr<int64_t>();
  const int64_t N = ids.size(0);
  TORCH_CHECK(cu.numel() >= 2 && c[0] == 0 && c[cu.numel() - 1] == N,
              "packed_next_token_loss: expected cu_seqlens from 0 to the ", N, " tokens, got ", cu_seqlens);
  // Rows that predict a token of their own document: all but each document's last.
  std::vector<int64_t> rows;
  rows.reserve(static_cast<size_t>(N));
  for (int64_t s = 0; s + 1 < cu.numel(); ++s) {
    TORCH_CHECK(c[s + 1] > c[s], "packed_next_token_loss: expected cu_seqlens increasing, got ", cu_seqlens);
    for (int64_t i = c[s]; i + 1 < c[s + 1]; ++i) rows.push_back(i);
  }
  TORCH_CHECK(!rows.empty(), "packed_next_token_loss: expected a document of two tokens or more, got ", cu_seqlens);
  const at::Tensor from = at::tensor(rows, at::kLong).to(logits.device());
  // Half-precision logits summed in float32, as transformers' loss upcasts them.
  at::Tensor picked = logits.index_select(0, from);
  if (picked.scalar_type() == at::kHalf || picked.scalar_type() == at::kBFloat16) picked = picked.to(at::kFloat);
  return at::cross_entropy_loss(picked, ids.index_select(0, from + 1));
}

at::Tensor CausalLMImpl::embed(const at::Tensor& ids) {
  // A tied head frozen to bfloat16/int8 holds the only copy of the table.
  at::Tensor x = released(embed_tokens->weight) ? packed_head_->weight_rows(ids) : embed_tokens(ids);
  if (!config_.gemma_norms) return x;
  // Gemma 2: times sqrt(hidden_size) rounded to the embeddings' dtype, as transformers.
  return x * at::scalar_tensor(std::sqrt(static_cast<double>(config_.hidden_size)), x.options());
}

at::Tensor CausalLMImpl::head(const at::Tensor& x) {
  const at::Tensor& weight = lm_head ? lm_head->weight : embed_tokens->weight;
  // The packed head is faster even for one row (a vocabulary's worth of outputs).
  at::Tensor logits = torchattn::PackPolicy{.on = pack_.on, .min_rows = 1}.routes(packed_head_.get(), x, {weight})
                          ? packed_head_->forward(x, {weight})
                          : torchattn::functional::linear(x, weight);
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

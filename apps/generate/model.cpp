#include "model.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/silu.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <map>

namespace generate {

RMSNormImpl::RMSNormImpl(int64_t size, double eps_) : eps(eps_) {
  weight = register_parameter("weight", torch::ones({size}));
}

namespace {

// RMSNorm of float32 CPU rows in one pass each (no gradient): the sum of squares in
// double, then x * rsqrt(mean + eps) * weight, as transformers' LlamaRMSNorm computes
// it in float32 (equal within float32 rounding). The composite below costs five
// passes and four temporaries of x's size.
bool fused_rms_norm_applies(const at::Tensor& x, const at::Tensor& weight) {
  const bool grad = c10::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad());
  return !grad && x.is_cpu() && weight.is_cpu() && x.scalar_type() == at::kFloat &&
         weight.scalar_type() == at::kFloat && weight.is_contiguous() && x.dim() >= 1 && x.size(-1) == weight.numel();
}

at::Tensor fused_rms_norm(const at::Tensor& x_in, const at::Tensor& weight, double eps) {
  const at::Tensor x = x_in.contiguous();
  at::Tensor y = at::empty_like(x);
  const int64_t n = x.size(-1), rows = n == 0 ? 0 : x.numel() / n;
  const float* xs = x.const_data_ptr<float>();
  const float* w = weight.const_data_ptr<float>();
  float* ys = y.mutable_data_ptr<float>();
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = xs + r * n;
      float* yr = ys + r * n;
      double sum = 0.0;
      for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(xr[i]) * xr[i];
      const float variance = static_cast<float>(sum / static_cast<double>(n));
      const float inv = 1.0f / std::sqrt(variance + static_cast<float>(eps));
      for (int64_t i = 0; i < n; ++i) yr[i] = w[i] * (xr[i] * inv);
    }
  });
  return y;
}

} // namespace

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  if (fused_rms_norm_applies(x, weight)) return fused_rms_norm(x, weight, eps);
  const at::Tensor h = x.to(at::kFloat);
  const at::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  return weight * (h * at::rsqrt(variance + eps)).to(x.scalar_type());
}

DecoderLayerImpl::DecoderLayerImpl(const ModelConfig& c, int64_t layer, int64_t context_length) {
  input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  auto attn = torchattn::MultiHeadAttentionOptions(c.hidden_size, c.hidden_size, context_length, c.num_heads)
                  .num_kv_heads(c.num_kv_heads)
                  .rope(torchattn::RoPEOptions(c.rope_theta))
                  .qkv_bias(c.qkv_bias)
                  .out_bias(c.o_bias)
                  .mask_buffer(false);
  attn.window(c.windows.at(static_cast<size_t>(layer)));
  self_attn = register_module("self_attn", torchattn::MultiHeadAttention(attn));
  post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  const auto mlp = [&](int64_t in, int64_t out) { return torch::nn::LinearOptions(in, out).bias(c.mlp_bias); };
  gate_proj = register_module("gate_proj", torch::nn::Linear(mlp(c.hidden_size, c.intermediate_size)));
  up_proj = register_module("up_proj", torch::nn::Linear(mlp(c.hidden_size, c.intermediate_size)));
  down_proj = register_module("down_proj", torch::nn::Linear(mlp(c.intermediate_size, c.hidden_size)));
}

at::Tensor DecoderLayerImpl::forward(const at::Tensor& x, torchattn::KVCache* cache, const at::Tensor& key_padding_mask) {
  const at::Tensor a = input_layernorm(x);
  at::Tensor h = cache != nullptr ? self_attn->forward_cached(a, *cache, key_padding_mask)
                                  : self_attn->forward(a, key_padding_mask);
  // Residual sums written in place where no gradient is kept (generation): the same
  // values, one allocation fewer each.
  const bool in_place = !c10::GradMode::is_enabled();
  h = in_place ? h.add_(x) : h + x;
  const at::Tensor m = post_attention_layernorm(h);
  auto linear = [](const torch::nn::Linear& l, const at::Tensor& in) {
    return torchattn::functional::linear(in, l->weight, l->bias);
  };
  at::Tensor gate = linear(gate_proj, m);
  gate = in_place ? at::silu_(gate).mul_(linear(up_proj, m)) : at::silu(gate) * linear(up_proj, m);
  const at::Tensor out = linear(down_proj, gate);
  return in_place ? out.add_(h) : out + h;
}

CausalLMImpl::CausalLMImpl(const ModelConfig& config, int64_t context_length)
    : config_(config), context_length_(context_length) {
  TORCH_CHECK(context_length > 0 && context_length <= config.max_position_embeddings,
              "CausalLM: expected a context_length in [1, max_position_embeddings=", config.max_position_embeddings,
              "], got ", context_length);
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(config.vocab_size, config.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_layers; ++i) layers->push_back(DecoderLayer(config, i, context_length));
  norm = register_module("norm", RMSNorm(config.hidden_size, config.rms_norm_eps));
  if (!config.tie_word_embeddings) {
    lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(config.hidden_size, config.vocab_size)
                                                               .bias(false)));
  }
}

std::string hf_name(const std::string& name) {
  static const std::map<std::string, std::string> parts{{"W_query", "q_proj"}, {"W_key", "k_proj"},
                                                        {"W_value", "v_proj"}, {"out_proj", "o_proj"}};
  if (name.rfind("lm_head.", 0) == 0) return name;
  std::string out = "model." + name;
  for (const auto& [ours, theirs] : parts) {
    const auto at = out.find("." + ours + ".");
    if (at != std::string::npos) out.replace(at + 1, ours.size(), theirs);
  }
  for (const char* mlp : {".gate_proj.", ".up_proj.", ".down_proj."}) {
    const auto at = out.find(mlp);
    if (at != std::string::npos) out.insert(at, ".mlp");
  }
  return out;
}

void CausalLMImpl::load_weights(const torchattn::NamedTensors& tensors) {
  std::map<std::string, at::Tensor> by_name(tensors.begin(), tensors.end());
  torch::NoGradGuard no_grad;
  // Check everything before changing anything.
  std::vector<std::pair<at::Tensor, at::Tensor>> staged;
  for (auto& p : named_parameters()) {
    const std::string key = hf_name(p.key());
    const auto it = by_name.find(key);
    TORCH_CHECK(it != by_name.end(), "CausalLM: the checkpoint has no tensor '", key, "'");
    TORCH_CHECK(it->second.sizes() == p.value().sizes(), "CausalLM: checkpoint tensor '", key, "' has shape ",
                it->second.sizes(), ", expected ", p.value().sizes());
    TORCH_CHECK(at::isFloatingType(it->second.scalar_type()), "CausalLM: checkpoint tensor '", key,
                "' is not floating point: ", it->second.scalar_type());
    staged.emplace_back(p.value(), it->second);
    by_name.erase(it);
  }
  for (const auto& [key, t] : by_name) {
    // A tied head may be saved anyway; rotary tables are recomputed.
    const bool tied_head = key == "lm_head.weight" && config_.tie_word_embeddings;
    TORCH_CHECK(tied_head || key.find("rotary_emb.inv_freq") != std::string::npos, "CausalLM: the checkpoint has "
                "tensor '", key, "', which this ", config_.model_type, " model does not use");
  }
  for (auto& [param, value] : staged) {
    if (value.device() == param.device() && value.scalar_type() == param.scalar_type() && value.is_contiguous()) {
      param.set_data(value);  // the checkpoint's own memory: no copy
    } else {
      param.set_data(value.to(param.device(), param.scalar_type()).contiguous());
    }
  }
}

std::vector<torchattn::KVCache> CausalLMImpl::make_caches(int64_t batch, bool static_shapes) const {
  std::vector<torchattn::KVCache> caches;
  for (const auto& layer : *layers) {
    caches.push_back(layer->as<DecoderLayerImpl>()->self_attn->make_kv_cache(batch, static_shapes));
  }
  return caches;
}

at::Tensor CausalLMImpl::forward(const at::Tensor& ids, std::vector<torchattn::KVCache>* caches,
                                 const at::Tensor& key_padding_mask, bool last_only) {
  TORCH_CHECK(ids.dim() == 2 && ids.scalar_type() == at::kLong, "CausalLM: expected int64 ids [B, T], got ",
              ids.sizes(), " of ", ids.scalar_type());
  TORCH_CHECK(caches == nullptr || caches->size() == layers->size(), "CausalLM: expected ", layers->size(),
              " caches, got ", caches == nullptr ? 0 : caches->size());
  at::Tensor x = embed_tokens(ids);
  for (size_t i = 0; i < layers->size(); ++i) {
    x = layers[i]->as<DecoderLayerImpl>()->forward(x, caches != nullptr ? &(*caches)[i] : nullptr, key_padding_mask);
  }
  if (last_only) {
    x = x.narrow(1, x.size(1) - 1, 1);
  }
  x = norm(x);
  return torchattn::functional::linear(x, lm_head ? lm_head->weight : embed_tokens->weight);
}

} // namespace generate

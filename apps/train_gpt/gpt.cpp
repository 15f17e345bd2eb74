#include "gpt.h"

#include <memory>

namespace train_gpt {

BlockImpl::BlockImpl(const GPTConfig& c) {
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
  attn = register_module("attn",
                         torchattn::MultiHeadAttention(
                             torchattn::MultiHeadAttentionOptions(c.d_model, c.d_model, c.context_length, c.n_head)
                                 .dropout(c.dropout)
                                 .qkv_bias(true)));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
  mlp = register_module("mlp", torch::nn::Sequential(torch::nn::Linear(c.d_model, 4 * c.d_model), torch::nn::GELU(),
                                                     torch::nn::Linear(4 * c.d_model, c.d_model),
                                                     torch::nn::Dropout(c.dropout)));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  auto h = x + attn(ln1(x));
  return h + mlp->forward(ln2(h));
}

torch::Tensor BlockImpl::forward_packed(const torch::Tensor& x, const torch::Tensor& cu_seqlens) {
  auto h = x + attn->forward_packed(ln1(x), cu_seqlens);
  return h + mlp->forward(ln2(h));
}

torch::Tensor BlockImpl::forward_cached(const torch::Tensor& x, torchattn::KVCache& cache) {
  auto h = x + attn->forward_cached(ln1(x), cache);
  return h + mlp->forward(ln2(h));
}

GPTImpl::GPTImpl(const GPTConfig& c) : config(c) {
  tok_emb = register_module("tok_emb", torch::nn::Embedding(c.vocab_size, c.d_model));
  pos_emb = register_module("pos_emb", torch::nn::Embedding(c.context_length, c.d_model));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.n_layer; ++i) blocks->push_back(Block(c));
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
  // GPT-2's initialisation: small normal weights, residual projections scaled by depth.
  torch::NoGradGuard no_grad;
  for (auto& p : named_parameters()) {
    const auto& name = p.key();
    if (name.find("ln") != std::string::npos || name.find("mask") != std::string::npos) continue;
    if (name.size() > 5 && name.substr(name.size() - 5) == ".bias") {
      p.value().zero_();
    } else {
      const bool residual = name.find("out_proj.weight") != std::string::npos ||
                            name.find("mlp.2.weight") != std::string::npos;
      p.value().normal_(0.0, residual ? 0.02 / std::sqrt(2.0 * c.n_layer) : 0.02);
    }
  }
}

torch::Tensor GPTImpl::forward(const torch::Tensor& idx) {
  const int64_t T = idx.size(1);
  TORCH_CHECK(T <= config.context_length, "GPT: expected at most context_length=", config.context_length,
              " tokens, got ", T);
  auto pos = torch::arange(T, idx.options());
  auto x = tok_emb(idx) + pos_emb(pos);
  for (size_t i = 0; i < blocks->size(); ++i) x = run_block(i, x, {});
  return torch::linear(ln_f(x), tok_emb->weight);  // head tied to the embedding
}

torch::Tensor GPTImpl::forward_packed(const torch::Tensor& idx, const torch::Tensor& positions,
                                      const torch::Tensor& cu_seqlens) {
  TORCH_CHECK(idx.dim() == 1 && positions.sizes() == idx.sizes(),
              "GPT: forward_packed expected idx [N] and positions [N], got ", idx.sizes(), " and ", positions.sizes());
  auto x = tok_emb(idx) + pos_emb(positions);  // pos_emb checks positions < context_length
  for (size_t i = 0; i < blocks->size(); ++i) x = run_block(i, x, cu_seqlens);
  return torch::linear(ln_f(x), tok_emb->weight);
}

torch::Tensor GPTImpl::run_block(size_t i, const torch::Tensor& x, const torch::Tensor& cu_seqlens) {
  auto* block = blocks[i]->as<BlockImpl>();
  auto fn = [block, cu_seqlens](const at::Tensor& t) {
    return cu_seqlens.defined() ? block->forward_packed(t, cu_seqlens) : block->forward(t);
  };
  if (!config.checkpoint_activations || !is_training()) return fn(x);
  return torchattn::checkpoint(fn, x, block->parameters());
}

std::vector<torchattn::KVCache> GPTImpl::make_kv_caches(int64_t batch_size, bool static_shapes) const {
  std::vector<torchattn::KVCache> caches;
  for (const auto& b : *blocks) caches.push_back(b->as<BlockImpl>()->attn->make_kv_cache(batch_size, static_shapes));
  return caches;
}

torch::Tensor GPTImpl::forward_cached(const torch::Tensor& idx, std::vector<torchattn::KVCache>& caches) {
  const int64_t T = idx.size(1);
  TORCH_CHECK(caches.front().length() + T <= config.context_length, "GPT: the caches hold ", caches.front().length(),
              " tokens; ", T, " more would pass context_length=", config.context_length);
  // Each sequence's positions count its real tokens ([B, T]), inside a graph too.
  auto pos = caches.front().token_positions().unsqueeze(1) + torch::arange(T, idx.options());
  auto x = tok_emb(idx) + pos_emb(pos);
  for (size_t i = 0; i < blocks->size(); ++i) x = blocks[i]->as<BlockImpl>()->forward_cached(x, caches[i]);
  return torch::linear(ln_f(x), tok_emb->weight);
}

std::vector<int64_t> GPTImpl::generate(const std::vector<int64_t>& prompt, int64_t n, double temperature, int64_t top_k,
                                       torch::Generator& gen) {
  torch::NoGradGuard no_grad;
  const bool was_training = is_training();
  eval();
  const torch::Device device = tok_emb->weight.device();
  const bool graphs = device.is_cuda();
  auto caches = make_kv_caches(1, /*static_shapes=*/graphs);
  std::vector<torchattn::KVCache*> cache_ptrs;
  cache_ptrs.reserve(caches.size());
  for (auto& c : caches) cache_ptrs.push_back(&c);
  std::unique_ptr<torchattn::DecodeGraph> step;  // CUDA: the one-token step, captured once
  std::vector<int64_t> out;
  auto idx = torch::tensor(prompt, torch::kLong).unsqueeze(0).to(device);
  for (int64_t i = 0; i < n && caches.front().length() + idx.size(1) <= config.context_length; ++i) {
    torch::Tensor logits;
    if (graphs && i > 0) {
      if (!step) {
        step = std::make_unique<torchattn::DecodeGraph>(
            [this, &caches](const torch::Tensor& t) { return forward_cached(t, caches); }, cache_ptrs);
      }
      logits = (*step)(idx);
    } else {
      logits = forward_cached(idx, caches);  // the prompt, and every step on the CPU
    }
    logits = logits.select(1, -1).squeeze(0).to(torch::kCPU, torch::kFloat) / temperature;  // [vocab]
    if (top_k > 0 && top_k < logits.size(0)) {
      auto kth = std::get<0>(logits.topk(top_k)).select(0, -1);
      logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
    }
    const int64_t next = torch::multinomial(torch::softmax(logits, -1), 1, false, gen).item<int64_t>();
    out.push_back(next);
    idx = torch::tensor({next}, torch::kLong).unsqueeze(0).to(device);
  }
  train(was_training);
  return out;
}

}  // namespace train_gpt

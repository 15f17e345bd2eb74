#pragma once

// A small GPT-style decoder on torchattn::MultiHeadAttention: token and position
// embeddings, pre-norm blocks (LayerNorm -> attention -> residual, LayerNorm -> MLP
// -> residual), a final LayerNorm and an output head tied to the token embedding.

#include <torchattn/torchattn.h>

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace train_gpt {

struct GPTConfig {
  int64_t vocab_size = 256;  // bytes
  int64_t context_length = 128;
  int64_t d_model = 128;
  int64_t n_layer = 4;
  int64_t n_head = 4;
  double dropout = 0.0;
};

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GPTConfig& c);
  /// x: [B, T, d_model] -> [B, T, d_model]
  torch::Tensor forward(const torch::Tensor& x);
  /// The same for new tokens after those in `cache` (generation).
  torch::Tensor forward_cached(const torch::Tensor& x, torchattn::KVCache& cache);

  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torchattn::MultiHeadAttention attn{nullptr};
  torch::nn::Sequential mlp{nullptr};
};
TORCH_MODULE(Block);

class GPTImpl : public torch::nn::Module {
 public:
  explicit GPTImpl(const GPTConfig& c);

  /// idx: [B, T] int64 token ids, T <= context_length -> logits [B, T, vocab_size]
  torch::Tensor forward(const torch::Tensor& idx);

  /// One KV cache per block, for `batch_size` sequences (static_shapes: for DecodeGraph).
  std::vector<torchattn::KVCache> make_kv_caches(int64_t batch_size, bool static_shapes = false) const;

  /// idx: [B, T_new] after the tokens in `caches` -> logits [B, T_new, vocab_size].
  /// Positions come from the caches' device-side position(): no host synchronisation,
  /// so a step can be captured in a CUDA graph.
  torch::Tensor forward_cached(const torch::Tensor& idx, std::vector<torchattn::KVCache>& caches);

  /// Samples `n` tokens after `prompt` ([T0] int64) with the KV caches: temperature,
  /// then the top-k logits. Stops at context_length. Returns the new tokens. On CUDA,
  /// every step after the prompt is replayed from a CUDA graph (torchattn::DecodeGraph).
  /// Sampling runs on the CPU with `gen`, so a seed gives the same draws on any device
  /// for the same logits.
  std::vector<int64_t> generate(const std::vector<int64_t>& prompt, int64_t n, double temperature, int64_t top_k,
                                torch::Generator& gen);

  GPTConfig config;
  torch::nn::Embedding tok_emb{nullptr}, pos_emb{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
};
TORCH_MODULE(GPT);

}  // namespace train_gpt

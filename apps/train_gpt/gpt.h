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
  /// In training, each block's activations freed after its forward and recomputed in
  /// the backward (torchattn::checkpoint): less memory for one more forward.
  bool checkpoint_activations = false;
};

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GPTConfig& c);
  /// x: [B, T, d_model] -> [B, T, d_model]
  torch::Tensor forward(const torch::Tensor& x);
  /// Documents end to end: x [N, d_model], cu_seqlens [S + 1] -> [N, d_model], each
  /// document attending within itself (MultiHeadAttention::forward_packed).
  torch::Tensor forward_packed(const torch::Tensor& x, const torch::Tensor& cu_seqlens);
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

  /// Documents end to end, without padding: idx [N] int64, positions [N] (restarting
  /// at 0 in each document, each < context_length), cu_seqlens [S + 1] -> logits
  /// [N, vocab_size], each document's equal to forward on it alone.
  torch::Tensor forward_packed(const torch::Tensor& idx, const torch::Tensor& positions,
                               const torch::Tensor& cu_seqlens);

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

 private:
  // Block i on x (and cu_seqlens where defined), checkpointed in training with
  // config.checkpoint_activations.
  torch::Tensor run_block(size_t i, const torch::Tensor& x, const torch::Tensor& cu_seqlens);
};
TORCH_MODULE(GPT);

}  // namespace train_gpt

#pragma once

// Choosing the next token from logits: greedy, or sampled after temperature, top-k
// and top-p (nucleus) filtering, in that order, as transformers' generate does; before
// either, OpenAI's logit_bias and presence and frequency penalties. And the
// log-probabilities a client may ask for with each token.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchattn::models {

/// (token id, bias) pairs added to those tokens' logits (OpenAI's logit_bias).
using LogitBias = std::vector<std::pair<int64_t, double>>;

struct SamplingOptions {
  /// The most likely token (default), else sampled after temperature, top_k and top_p.
  TORCH_ARG(bool, greedy) = true;
  /// > 0.
  TORCH_ARG(double, temperature) = 1.0;
  /// 0: off.
  TORCH_ARG(int64_t, top_k) = 0;
  /// In (0, 1]; 1: off.
  TORCH_ARG(double, top_p) = 1.0;
  TORCH_ARG(uint64_t, seed) = 0;
  /// (token id, bias) added to the logits before the choice (OpenAI's logit_bias).
  TORCH_ARG(LogitBias, logit_bias) = {};
  /// OpenAI's penalties over the tokens this sampler chose so far:
  /// logit[j] -= frequency_penalty * count[j] + presence_penalty * (count[j] > 0).
  TORCH_ARG(double, presence_penalty) = 0.0;
  TORCH_ARG(double, frequency_penalty) = 0.0;
};

class Sampler {
 public:
  /// Checks the options (check()).
  explicit Sampler(const SamplingOptions& options);
  /// The options' checks alone: finite values, temperature > 0 when sampling,
  /// top_k >= 0, top_p in (0, 1], bias ids >= 0.
  static void check(const SamplingOptions& options);
  /// logits: [vocab] (any dtype and device) -> the chosen token id, which the
  /// penalties count from then on. Sampling runs on the CPU in float32 with the
  /// seeded generator, so a seed gives the same tokens on any device for the same
  /// logits. A logit_bias id past the vocabulary is an error.
  int64_t next(const at::Tensor& logits);
  /// True when next() takes the most likely token of the logits as they are (greedy,
  /// no logit_bias, no penalties): a caller may take one argmax over many rows
  /// instead, then tell the sampler with chose().
  bool greedy() const { return plain_greedy_; }
  /// Counts `token` as chosen (for the penalties) when the caller chose it itself.
  void chose(int64_t token) { ++counts_[token]; }

 private:
  SamplingOptions options_;
  bool adjusts_;       // logit_bias or a penalty changes the logits before the choice
  bool plain_greedy_;  // greedy && !adjusts_
  at::Generator generator_;
  std::unordered_map<int64_t, int64_t> counts_;  // tokens chosen so far
};

/// A token's log-probability and, when asked, the most likely tokens' at its position.
struct TokenLogprob {
  int64_t token = 0;
  double logprob = 0.0;
};
struct TokenLogprobs {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;  // most likely first
};

/// logits: [vocab] -> log_softmax(logits)[token] in float32 and the `top` largest
/// (0 <= top <= vocab), most likely first. The model's own distribution: before logit_bias,
/// penalties, temperature, top-k and top-p (as vLLM's raw log-probabilities).
TokenLogprobs token_logprobs(const at::Tensor& logits, int64_t token, int64_t top);

}  // namespace torchattn::models

#pragma once

// Choosing the next token from logits: greedy, or sampled after temperature, top-k
// and top-p (nucleus) filtering, in that order, as transformers' generate does.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace torchattn::models {

struct SamplingOptions {
  bool greedy = true;
  double temperature = 1.0;  // > 0
  int64_t top_k = 0;         // 0: off
  double top_p = 1.0;        // in (0, 1]; 1: off
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& options);
  /// logits: [vocab] (any dtype and device) -> the chosen token id. Sampling runs on
  /// the CPU in float32 with the seeded generator, so a seed gives the same tokens on
  /// any device for the same logits.
  int64_t next(const at::Tensor& logits);
  /// True when next() takes the most likely token.
  bool greedy() const { return options_.greedy; }

 private:
  SamplingOptions options_;
  at::Generator generator_;
};

} // namespace torchattn::models

#pragma once

// What the generate loops (a decoder's, an encoder-decoder's) share: checking the
// prompts, and each step's choice of every unfinished prompt's next token (its own
// Sampler, forced tokens, stop tokens, on_token), with the results and timings.

#include <torchattn/models/generation.h>

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

namespace torchattn::models::generation {

/// Checks that there are prompts, each non-empty, each at most max_tokens long (when
/// > 0; `what` names the limit), each id in [0, vocab_size), and that max_new_tokens
/// >= 1. Returns the longest prompt's length.
int64_t check_prompts(const std::vector<std::vector<int64_t>>& prompts, const GenerationOptions& options,
                      int64_t vocab_size, int64_t max_tokens = 0, const char* what = "");

class GenerationSteps {
 public:
  /// One Sampler per prompt (which validates the sampling options); `stop`: the
  /// tokens that end a sequence (the options' stop_token_ids and the model's EOS).
  /// `options` must outlive this object (its on_token is called, not copied).
  GenerationSteps(const std::vector<std::vector<int64_t>>& prompts, const GenerationOptions& options,
                  std::vector<int64_t> stop);

  /// logits: [B, vocab], the next token's for every prompt. Chooses each unfinished
  /// prompt's token (`forced` where given), calls on_token, and marks the ones that
  /// stop. Returns the tokens to feed next, `filler` for the finished ones. An
  /// unfinished prompt's logits that are not finite are an error naming the step.
  std::vector<int64_t> choose(const at::Tensor& logits, std::optional<int64_t> forced, int64_t filler);
  /// The same where the tokens were chosen already, on the model's device, by
  /// argmax_or_minus_one (greedy_on_device): `ids` [B] int64, any device; -1, logits
  /// that were not finite, is the same error.
  std::vector<int64_t> chosen(const at::Tensor& ids, int64_t filler);
  /// Whether every prompt's choice is a plain argmax of the logits that needs nothing
  /// else of them: greedy, no logit bias, no penalties, no logprobs. The step may then
  /// take the argmax itself (inside a CUDA graph) and hand chosen() the ids.
  bool greedy_on_device() const;

  /// Starts the clock: the prefill's time runs from here to the first choose().
  void begin() { start_ = std::chrono::steady_clock::now(); }
  bool finished() const { return remaining_ == 0; }
  /// The results, with the prefill's time (to the first choice) and the rest's.
  std::vector<GenerationResult> results();

 private:
  // Records prompt b's token (`row` its logits, for logprobs, or undefined), calls
  // on_token and marks a stop.
  void record(size_t b, int64_t token, const at::Tensor& row);
  // After a step's choices: the prefill's time at the first.
  void step_done();
  const GenerationOptions& options_;  // the caller's, on_token included
  std::vector<int64_t> stop_;
  std::vector<Sampler> samplers_;
  std::vector<GenerationResult> results_;
  std::vector<bool> done_;
  size_t remaining_;
  int64_t steps_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  double prefill_ = 0.0;
};

}  // namespace torchattn::models::generation

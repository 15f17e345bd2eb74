#pragma once

// Generation with a CausalLM: a batch of prompts of different lengths (left-padded,
// decoded together with KV caches), greedy or sampled, with stop tokens, a limit on
// new tokens and a callback for each token as it is chosen.

#include <torchattn/models/causal_lm.h>
#include <torchattn/models/sampler.h>

#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace torchattn::models {

struct GenerationOptions {
  /// New tokens per prompt at most (>= 1).
  TORCH_ARG(int64_t, max_new_tokens) = 64;
  /// false (default): greedy, the most likely token. true: sample after temperature,
  /// top-k and top-p, as transformers' generate(do_sample=True).
  TORCH_ARG(bool, do_sample) = false;
  /// > 0; with do_sample.
  TORCH_ARG(double, temperature) = 1.0;
  /// 0: off; with do_sample.
  TORCH_ARG(int64_t, top_k) = 0;
  /// In (0, 1]; 1: off; with do_sample.
  TORCH_ARG(double, top_p) = 1.0;
  /// (token id, bias) pairs added to those tokens' logits before each choice, greedy
  /// or sampled (OpenAI's logit_bias: -100 all but bans a token, 100 all but forces
  /// it). Ids in the vocabulary, biases finite.
  TORCH_ARG(LogitBias, logit_bias) = {};
  /// OpenAI's presence and frequency penalties, greedy or sampled: before each choice
  /// the logit of every token the sequence generated so far (not the prompt's) is
  /// lowered by presence_penalty, and by frequency_penalty times the number of times
  /// it came. Finite; 0: off.
  TORCH_ARG(double, presence_penalty) = 0.0;
  TORCH_ARG(double, frequency_penalty) = 0.0;
  /// Log-probabilities with each new token (GenerationResult::logprobs, the Engine's
  /// TokenEvent::logprobs): -1 (default) none; 0 the chosen token's; k in [1, 20] also
  /// the k most likely tokens'. From the model's distribution, log_softmax of the
  /// logits before logit_bias, penalties, temperature, top-k and top-p.
  TORCH_ARG(int64_t, logprobs) = -1;
  /// The sampling seed. Each prompt of a batch samples from its own generator seeded
  /// with it, so that a prompt gets the same tokens in any batch as alone.
  TORCH_ARG(uint64_t, seed) = 0;
  /// Tokens that end a sequence (kept as its last token), besides the model's EOS.
  TORCH_ARG(std::vector<int64_t>, stop_token_ids) = {};
  /// Stop at the config's eos_token_id too. Default: true.
  TORCH_ARG(bool, stop_at_eos) = true;
  /// Encoder-decoder models (Seq2SeqLM): the config's forced_bos_token_id as the first
  /// new token and forced_eos_token_id as the last one max_new_tokens allows, as
  /// transformers' generate does. Default: true. Decoders have no forced tokens.
  TORCH_ARG(bool, forced_tokens) = true;
  /// Called with (prompt index, token id) for each new token as soon as it is chosen.
  TORCH_ARG(std::function<void(size_t, int64_t)>, on_token) = nullptr;
};

struct GenerationResult {
  std::vector<int64_t> ids;             // the new tokens (the stop token included, if one came)
  std::vector<TokenLogprobs> logprobs;  // one per new token when options.logprobs >= 0
  bool stopped = false;                 // ended by a stop token (else by max_new_tokens)
  int64_t prompt_tokens = 0;
  double prefill_seconds = 0.0;  // the batch's prompt forward and first token
  double decode_seconds = 0.0;   // every step after the first
};

/// Generates after each prompt (token ids, each non-empty; prompt and new tokens must
/// fit the model's context_length). Each prompt gets the tokens it would get alone
/// (up to float rounding of the padded batch's matrix products, which can turn a
/// near-tie of the top two logits). On CUDA, a batch of one replays every step after
/// the first from a CUDA graph (torchattn::DecodeGraph).
std::vector<GenerationResult> generate(CausalLMImpl& model, const std::vector<std::vector<int64_t>>& prompts,
                                       const GenerationOptions& options = {});

/// The most alternatives GenerationOptions::logprobs may ask for (OpenAI's top_logprobs).
constexpr int64_t kMaxTopLogprobs = 20;

/// Checks the options that do not depend on a prompt against a vocabulary of
/// `vocab_size` tokens: max_new_tokens >= 1; stop_token_ids and logit_bias ids in the
/// vocabulary; logprobs in [-1, kMaxTopLogprobs]; temperature, top_k and top_p left at
/// their defaults unless do_sample (greedy would ignore them); the sampling values
/// (Sampler). `who` starts each message ("generate", "Engine").
void check_generation_options(const GenerationOptions& options, int64_t vocab_size, const char* who);

/// The sampling part of `options` (greedy unless do_sample).
SamplingOptions sampling_options(const GenerationOptions& options);

}  // namespace torchattn::models

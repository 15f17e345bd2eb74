#include "models/generation/generation_steps.h"

#include "models/generation/finite_logits.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <utility>

namespace torchattn::models::generation {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int64_t check_prompts(const std::vector<std::vector<int64_t>>& prompts, const GenerationOptions& options,
                      int64_t vocab_size, int64_t max_tokens, const char* what) {
  TORCH_CHECK(!prompts.empty(), "generate: expected at least one prompt, got none");
  check_generation_options(options, vocab_size, "generate");
  int64_t longest = 0;
  for (size_t b = 0; b < prompts.size(); ++b) {
    const auto n = static_cast<int64_t>(prompts[b].size());
    TORCH_CHECK(n > 0, "generate: prompt ", b, " has no tokens");
    TORCH_CHECK(max_tokens <= 0 || n <= max_tokens, "generate: prompt ", b, " has ", n, " tokens; ", what, " ",
                max_tokens);
    for (const int64_t id : prompts[b]) {
      TORCH_CHECK(id >= 0 && id < vocab_size, "generate: prompt ", b, " has token id ", id,
                  ", outside the vocabulary [0, ", vocab_size, ")");
    }
    longest = std::max(longest, n);
  }
  return longest;
}

GenerationSteps::GenerationSteps(const std::vector<std::vector<int64_t>>& prompts, const GenerationOptions& options,
                                 std::vector<int64_t> stop)
    : options_(options), stop_(std::move(stop)), results_(prompts.size()), done_(prompts.size(), false),
      remaining_(prompts.size()) {
  const SamplingOptions sampling = sampling_options(options);
  for (size_t b = 0; b < prompts.size(); ++b) {
    samplers_.emplace_back(sampling);
    results_[b].prompt_tokens = static_cast<int64_t>(prompts[b].size());
  }
}

std::vector<int64_t> GenerationSteps::choose(const at::Tensor& logits, std::optional<int64_t> forced, int64_t filler) {
  std::vector<int64_t> next(results_.size(), filler);
  const std::vector<bool> finite = finite_rows(logits);
  for (size_t b = 0; b < results_.size(); ++b) {
    if (done_[b]) continue;
    TORCH_CHECK(finite[b], non_finite_logits("generate", steps_ + 1, "prompt " + std::to_string(b)));
    const at::Tensor row = logits[static_cast<int64_t>(b)];
    if (forced) {
      next[b] = *forced;
      samplers_[b].chose(next[b]);
    } else {
      next[b] = samplers_[b].next(row);
    }
    record(b, next[b], row);
  }
  step_done();
  return next;
}

std::vector<int64_t> GenerationSteps::chosen(const at::Tensor& ids, int64_t filler) {
  TORCH_CHECK(ids.dim() == 1 && ids.size(0) == static_cast<int64_t>(results_.size()) && ids.scalar_type() == at::kLong,
              "GenerationSteps: expected the chosen ids as int64 [", results_.size(), "], got ", ids.scalar_type(), " ",
              ids.sizes());
  const at::Tensor host = ids.to(at::kCPU);
  const int64_t* id = host.data_ptr<int64_t>();
  std::vector<int64_t> next(results_.size(), filler);
  for (size_t b = 0; b < results_.size(); ++b) {
    if (done_[b]) continue;
    // argmax_or_minus_one's mark of a row that was not finite.
    TORCH_CHECK(id[b] >= 0, non_finite_logits("generate", steps_ + 1, "prompt " + std::to_string(b)));
    next[b] = id[b];
    samplers_[b].chose(next[b]);
    record(b, next[b], at::Tensor());
  }
  step_done();
  return next;
}

bool GenerationSteps::greedy_on_device() const {
  return options_.logprobs() < 0 &&
         std::all_of(samplers_.begin(), samplers_.end(), [](const Sampler& s) { return s.greedy(); });
}

void GenerationSteps::record(size_t b, int64_t token, const at::Tensor& row) {
  results_[b].ids.push_back(token);
  if (options_.logprobs() >= 0) results_[b].logprobs.push_back(token_logprobs(row, token, options_.logprobs()));
  if (options_.on_token()) options_.on_token()(b, token);
  if (std::find(stop_.begin(), stop_.end(), token) != stop_.end()) {
    results_[b].stopped = true;
    done_[b] = true;
    --remaining_;
  }
}

void GenerationSteps::step_done() {
  if (steps_++ == 0) {
    prefill_ = seconds_since(start_);
    start_ = std::chrono::steady_clock::now();
  }
}

std::vector<GenerationResult> GenerationSteps::results() {
  const double decode = seconds_since(start_);
  for (auto& r : results_) {
    r.prefill_seconds = prefill_;
    r.decode_seconds = r.ids.size() > 1 ? decode : 0.0;
  }
  return results_;
}

}  // namespace torchattn::models::generation

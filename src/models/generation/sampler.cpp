#include <torchattn/models/sampler.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/multinomial.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/topk.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <limits>

namespace torchattn::models {

Sampler::Sampler(const SamplingOptions& options)
    : options_(options), adjusts_(!options.logit_bias().empty() || options.presence_penalty() != 0.0 ||
                                  options.frequency_penalty() != 0.0),
      plain_greedy_(options.greedy() && !adjusts_),
      generator_(at::make_generator<at::CPUGeneratorImpl>(options.seed())) {
  check(options);
}

void Sampler::check(const SamplingOptions& options) {
  TORCH_CHECK(options.greedy() || (std::isfinite(options.temperature()) && options.temperature() > 0.0),
              "sampling: expected temperature > 0, got ", options.temperature());
  TORCH_CHECK(options.top_k() >= 0, "sampling: expected top_k >= 0, got ", options.top_k());
  TORCH_CHECK(options.top_p() > 0.0 && options.top_p() <= 1.0, "sampling: expected top_p in (0, 1], got ",
              options.top_p());
  TORCH_CHECK(std::isfinite(options.presence_penalty()), "sampling: expected a finite presence_penalty, got ",
              options.presence_penalty());
  TORCH_CHECK(std::isfinite(options.frequency_penalty()), "sampling: expected a finite frequency_penalty, got ",
              options.frequency_penalty());
  for (const auto& [id, bias] : options.logit_bias()) {
    TORCH_CHECK(id >= 0, "sampling: logit_bias expected token ids >= 0, got ", id);
    TORCH_CHECK(std::isfinite(bias), "sampling: logit_bias expected finite biases, got ", bias, " for token ", id);
  }
}

int64_t Sampler::next(const at::Tensor& logits) {
  at::Tensor scores = logits.to(at::kCPU, at::kFloat).reshape({-1});
  if (adjusts_) {
    // OpenAI's order does not matter here: every term is added to the logits.
    scores = scores.clone();
    float* s = scores.data_ptr<float>();
    const int64_t vocab = scores.size(0);
    for (const auto& [id, bias] : options_.logit_bias()) {
      TORCH_CHECK(id < vocab, "sampling: logit_bias names token ", id, ", outside the vocabulary [0, ", vocab, ")");
      s[id] += static_cast<float>(bias);
    }
    for (const auto& [id, count] : counts_) {
      if (id < vocab) {
        s[id] -= static_cast<float>(options_.frequency_penalty() * static_cast<double>(count) +
                                    options_.presence_penalty());
      }
    }
  }
  int64_t token = 0;
  if (options_.greedy()) {
    token = scores.argmax().item<int64_t>();
  } else {
    const float neg_inf = -std::numeric_limits<float>::infinity();
    scores = scores / options_.temperature();
    if (options_.top_k() > 0 && options_.top_k() < scores.size(0)) {
      const at::Tensor kth = std::get<0>(scores.topk(options_.top_k())).select(0, -1);
      scores = scores.masked_fill(scores < kth, neg_inf);
    }
    if (options_.top_p() < 1.0) {
      // transformers' TopPLogitsWarper: drop the tokens of lowest probability whose
      // cumulative probability is <= 1 - top_p, always keeping the most likely one.
      auto [sorted, order] = scores.sort(/*stable=*/false, /*dim=*/0, /*descending=*/false);
      const at::Tensor cumulative = sorted.softmax(0).cumsum(0);
      at::Tensor drop = cumulative <= (1.0 - options_.top_p());
      drop.select(0, -1).fill_(false);
      scores = scores.masked_fill(drop.scatter(0, order, drop), neg_inf);
    }
    token = at::multinomial(scores.softmax(0), 1, /*replacement=*/false, generator_).item<int64_t>();
  }
  chose(token);
  return token;
}

TokenLogprobs token_logprobs(const at::Tensor& logits, int64_t token, int64_t top) {
  const at::Tensor logp = logits.to(at::kCPU, at::kFloat).reshape({-1}).log_softmax(0);
  const int64_t vocab = logp.size(0);
  TORCH_CHECK(token >= 0 && token < vocab, "token_logprobs: expected a token in [0, ", vocab, "), got ", token);
  TORCH_CHECK(top >= 0 && top <= vocab, "token_logprobs: expected top in [0, ", vocab, "], got ", top);
  TokenLogprobs out;
  out.chosen = {token, logp[token].item<double>()};
  if (top > 0) {
    const auto [values, ids] = logp.topk(top);
    const float* v = values.const_data_ptr<float>();
    const int64_t* id = ids.const_data_ptr<int64_t>();
    for (int64_t i = 0; i < top; ++i) out.top.push_back({id[i], static_cast<double>(v[i])});
  }
  return out;
}

}  // namespace torchattn::models

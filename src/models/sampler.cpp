#include <torchattn/models/sampler.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/multinomial.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/topk.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <limits>

namespace torchattn::models {

Sampler::Sampler(const SamplingOptions& options) : options_(options), generator_(at::make_generator<at::CPUGeneratorImpl>(options.seed)) {
  TORCH_CHECK(options.greedy || (std::isfinite(options.temperature) && options.temperature > 0.0),
              "sampling: expected temperature > 0, got ", options.temperature);
  TORCH_CHECK(options.top_k >= 0, "sampling: expected top_k >= 0, got ", options.top_k);
  TORCH_CHECK(options.top_p > 0.0 && options.top_p <= 1.0, "sampling: expected top_p in (0, 1], got ", options.top_p);
}

int64_t Sampler::next(const at::Tensor& logits) {
  at::Tensor scores = logits.to(at::kCPU, at::kFloat).reshape({-1});
  if (options_.greedy) {
    return scores.argmax().item<int64_t>();
  }
  const float neg_inf = -std::numeric_limits<float>::infinity();
  scores = scores / options_.temperature;
  if (options_.top_k > 0 && options_.top_k < scores.size(0)) {
    const at::Tensor kth = std::get<0>(scores.topk(options_.top_k)).select(0, -1);
    scores = scores.masked_fill(scores < kth, neg_inf);
  }
  if (options_.top_p < 1.0) {
    // transformers' TopPLogitsWarper: drop the tokens of lowest probability whose
    // cumulative probability is <= 1 - top_p, always keeping the most likely one.
    auto [sorted, order] = scores.sort(/*stable=*/false, /*dim=*/0, /*descending=*/false);
    const at::Tensor cumulative = sorted.softmax(0).cumsum(0);
    at::Tensor drop = cumulative <= (1.0 - options_.top_p);
    drop.select(0, -1).fill_(false);
    scores = scores.masked_fill(drop.scatter(0, order, drop), neg_inf);
  }
  return at::multinomial(scores.softmax(0), 1, /*replacement=*/false, generator_).item<int64_t>();
}

} // namespace torchattn::models

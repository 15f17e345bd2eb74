#include <torchattn/models/generation.h>

#include <torchattn/decode_graph.h>

#include "models/generation/finite_logits.h"
#include "models/generation/generation_steps.h"

#include <ATen/ops/tensor.h>
#include <c10/core/InferenceMode.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>

namespace torchattn::models {

void check_generation_options(const GenerationOptions& o, int64_t vocab_size, const char* who) {
  TORCH_CHECK(o.max_new_tokens() >= 1, who, ": expected max_new_tokens >= 1, got ", o.max_new_tokens());
  for (const int64_t id : o.stop_token_ids()) {
    TORCH_CHECK(id >= 0 && id < vocab_size, who, ": stop_token_ids has token id ", id, ", outside the vocabulary [0, ",
                vocab_size, ")");
  }
  for (const auto& [id, bias] : o.logit_bias()) {
    TORCH_CHECK(id >= 0 && id < vocab_size, who, ": logit_bias has token id ", id, ", outside the vocabulary [0, ",
                vocab_size, ")");
  }
  const int64_t most = std::min(kMaxTopLogprobs, vocab_size);
  TORCH_CHECK(o.logprobs() >= -1 && o.logprobs() <= most, who, ": expected logprobs in [-1, ", most,
              "] (-1: none, 0: the chosen token's, k: and the k most likely, at most ", kMaxTopLogprobs,
              " and the vocabulary's size), got ", o.logprobs());
  if (!o.do_sample()) {
    // Greedy takes the most likely token: these would be ignored without a word.
    TORCH_CHECK(o.temperature() == 1.0, who, ": temperature ", o.temperature(),
                " is set but do_sample is false (greedy takes the most likely token whatever the temperature); set "
                "do_sample(true) to sample");
    TORCH_CHECK(o.top_k() == 0, who, ": top_k ", o.top_k(),
                " is set but do_sample is false; set do_sample(true) to sample");
    TORCH_CHECK(o.top_p() == 1.0, who, ": top_p ", o.top_p(),
                " is set but do_sample is false; set do_sample(true) to sample");
  }
  Sampler::check(sampling_options(o));
}

SamplingOptions sampling_options(const GenerationOptions& o) {
  return SamplingOptions()
      .greedy(!o.do_sample())
      .temperature(o.temperature())
      .top_k(o.top_k())
      .top_p(o.top_p())
      .seed(o.seed())
      .logit_bias(o.logit_bias())
      .presence_penalty(o.presence_penalty())
      .frequency_penalty(o.frequency_penalty());
}

std::vector<GenerationResult> generate(CausalLMImpl& model, const std::vector<std::vector<int64_t>>& prompts,
                                       const GenerationOptions& options) {
  const int64_t longest = generation::check_prompts(prompts, options, model.config().vocab_size);
  TORCH_CHECK(longest + options.max_new_tokens() <= model.context_length(), "generate: ", longest,
              " prompt tokens and ", options.max_new_tokens(), " new ones pass the context length ",
              model.context_length());
  const int64_t batch = static_cast<int64_t>(prompts.size());
  std::vector<int64_t> stop = options.stop_token_ids();
  if (options.stop_at_eos())
    stop.insert(stop.end(), model.config().eos_token_ids.begin(), model.config().eos_token_ids.end());
  generation::GenerationSteps steps(prompts, options, std::move(stop));

  c10::InferenceMode inference;
  model.eval();
  const auto device = model.embed_tokens->weight.device();
  const bool graphs = device.is_cuda() && batch == 1;
  // Caches of the tokens this call holds at most, not of the model's whole context.
  auto caches = model.make_kv_caches(batch, /*static_shapes=*/graphs, longest + options.max_new_tokens());
  std::vector<torchattn::KVCache*> cache_ptrs;
  cache_ptrs.reserve(caches.size());
  for (auto& c : caches) cache_ptrs.push_back(&c);
  std::unique_ptr<torchattn::DecodeGraph> step;

  // Left-padded prompts: every sequence's last prompt token in the last column.
  std::vector<int64_t> flat(static_cast<size_t>(batch * longest), 0);
  std::vector<uint8_t> pad(flat.size(), 0);
  bool padded = false;
  for (int64_t b = 0; b < batch; ++b) {
    const auto& p = prompts[static_cast<size_t>(b)];
    const int64_t offset = longest - static_cast<int64_t>(p.size());
    std::fill_n(pad.begin() + b * longest, offset, 1);
    std::copy(p.begin(), p.end(), flat.begin() + b * longest + offset);
    padded = padded || offset > 0;
  }
  at::Tensor ids = at::tensor(flat, at::kLong).view({batch, longest}).to(device);
  at::Tensor mask = padded
                        ? at::tensor(at::ArrayRef<uint8_t>(pad), at::kByte).view({batch, longest}).to(device, at::kBool)
                        : at::Tensor();
  // Plain greedy decoding takes the argmax on the model's device, inside the step (and
  // its CUDA graph): one id a prompt comes back, not the vocabulary's logits.
  const bool argmax_in_step = steps.greedy_on_device();
  const auto choice = [&](const at::Tensor& logits) {
    return argmax_in_step ? generation::argmax_or_minus_one(logits) : logits;
  };
  steps.begin();
  for (int64_t i = 0; i < options.max_new_tokens() && !steps.finished(); ++i) {
    at::Tensor out;  // [B, 1, vocab] logits, or [B, 1] ids
    if (graphs && i > 0) {
      if (!step) {
        step = std::make_unique<torchattn::DecodeGraph>(
            [&](const at::Tensor& t) { return choice(model.forward(t, &caches, {}, /*last_only=*/true)); }, cache_ptrs);
      }
      out = (*step)(ids);
    } else {
      out = choice(model.forward(ids, &caches, i == 0 ? mask : at::Tensor(), /*last_only=*/true));
    }
    // A finished sequence goes on with token 0, whose outputs nobody reads.
    const std::vector<int64_t> next = argmax_in_step ? steps.chosen(out.select(1, 0), 0)
                                                     : steps.choose(out.select(1, 0), std::nullopt, 0);
    ids = at::tensor(next, at::kLong).view({batch, 1}).to(device);
  }
  return steps.results();
}

}  // namespace torchattn::models

#include <torchattn/models/seq2seq_generation.h>

#include <ATen/ops/full.h>
#include <ATen/ops/tensor.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <optional>

namespace torchattn::models {

std::vector<GenerationResult> generate(Seq2SeqLMImpl& model, const std::vector<std::vector<int64_t>>& prompts,
                                       const GenerationOptions& options) {
  const BartConfig& config = model.config();
  TORCH_CHECK(!prompts.empty(), "generate: expected at least one prompt, got none");
  TORCH_CHECK(options.max_new_tokens() >= 1 && options.max_new_tokens() <= config.max_position_embeddings,
              "generate: expected max_new_tokens in [1, ", config.max_position_embeddings,
              "] (the decoder's max_position_embeddings), got ", options.max_new_tokens());
  const int64_t batch = static_cast<int64_t>(prompts.size());
  int64_t longest = 0;
  for (size_t b = 0; b < prompts.size(); ++b) {
    TORCH_CHECK(!prompts[b].empty(), "generate: prompt ", b, " has no tokens");
    TORCH_CHECK(static_cast<int64_t>(prompts[b].size()) <= config.max_position_embeddings, "generate: prompt ", b,
                " has ", prompts[b].size(), " tokens; the encoder has positions for ", config.max_position_embeddings,
                " (max_position_embeddings)");
    for (const int64_t id : prompts[b]) {
      TORCH_CHECK(id >= 0 && id < config.vocab_size, "generate: prompt ", b, " has token id ", id,
                  ", outside the vocabulary [0, ", config.vocab_size, ")");
    }
    longest = std::max<int64_t>(longest, static_cast<int64_t>(prompts[b].size()));
  }
  std::vector<int64_t> stop = options.stop_token_ids();
  if (options.stop_at_eos()) stop.insert(stop.end(), config.eos_token_ids.begin(), config.eos_token_ids.end());
  const SamplingOptions sampling = sampling_options(options);
  std::vector<Sampler> samplers;
  for (int64_t b = 0; b < batch; ++b) samplers.emplace_back(sampling);  // validates the options

  c10::InferenceMode inference;
  model.eval();
  const auto device = model.shared->weight.device();

  // Right-padded prompts: positions count from 0 in every row, as alone.
  std::vector<int64_t> flat(static_cast<size_t>(batch * longest), config.pad_token_id);
  std::vector<uint8_t> pad(flat.size(), 1);
  std::vector<GenerationResult> results(prompts.size());
  for (int64_t b = 0; b < batch; ++b) {
    const auto& p = prompts[static_cast<size_t>(b)];
    std::copy(p.begin(), p.end(), flat.begin() + b * longest);
    std::fill_n(pad.begin() + b * longest, p.size(), 0);
    results[static_cast<size_t>(b)].prompt_tokens = static_cast<int64_t>(p.size());
  }
  const bool padded = std::any_of(prompts.begin(), prompts.end(),
                                  [&](const auto& p) { return static_cast<int64_t>(p.size()) < longest; });
  const at::Tensor ids = at::tensor(flat, at::kLong).view({batch, longest}).to(device);
  const at::Tensor mask =
      padded ? at::tensor(at::ArrayRef<uint8_t>(pad), at::kByte).view({batch, longest}).to(device, at::kBool)
             : at::Tensor();

  auto start = std::chrono::steady_clock::now();
  const auto seconds_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  const std::vector<torchattn::CrossKV> context = model.cross_kvs(model.encode(ids, mask), mask);
  auto caches = model.make_caches(batch);
  at::Tensor next_ids = at::full({batch, 1}, config.decoder_start_token_id, at::TensorOptions(at::kLong).device(device));
  std::vector<bool> done(prompts.size(), false);
  size_t remaining = prompts.size();
  double prefill = 0.0;
  const int64_t last_step = options.max_new_tokens() - 1;
  for (int64_t i = 0; i <= last_step && remaining > 0; ++i) {
    const at::Tensor logits = model.decode(next_ids, context, &caches, /*last_only=*/true).select(1, 0);  // [B, vocab]
    // transformers' ForcedBOSTokenLogitsProcessor then ForcedEOSTokenLogitsProcessor:
    // where both apply (max_new_tokens 1) the EOS wins.
    std::optional<int64_t> forced;
    if (options.forced_tokens()) {
      if (i == last_step && config.forced_eos_token_id) {
        forced = config.forced_eos_token_id;
      } else if (i == 0 && config.forced_bos_token_id) {
        forced = config.forced_bos_token_id;
      }
    }
    std::vector<int64_t> next(prompts.size(), config.pad_token_id);
    for (size_t b = 0; b < prompts.size(); ++b) {
      if (done[b]) continue;
      next[b] = forced ? *forced : samplers[b].next(logits[static_cast<int64_t>(b)]);
      results[b].ids.push_back(next[b]);
      if (options.on_token()) options.on_token()(b, next[b]);
      if (std::find(stop.begin(), stop.end(), next[b]) != stop.end()) {
        results[b].stopped = true;
        done[b] = true;
        --remaining;
      }
    }
    if (i == 0) {
      prefill = seconds_since(start);
      start = std::chrono::steady_clock::now();
    }
    // A finished sequence goes on with the pad token, whose outputs nobody reads.
    next_ids = at::tensor(next, at::kLong).view({batch, 1}).to(device);
  }
  const double decode = seconds_since(start);
  for (auto& r : results) {
    r.prefill_seconds = prefill;
    r.decode_seconds = r.ids.size() > 1 ? decode : 0.0;
  }
  return results;
}

} // namespace torchattn::models

#include <torchattn/models/seq2seq_generation.h>

#include "models/generation/generation_steps.h"

#include <ATen/ops/full.h>
#include <ATen/ops/tensor.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <optional>
#include <utility>

namespace torchattn::models {

std::vector<GenerationResult> generate(Seq2SeqLMImpl& model, const std::vector<std::vector<int64_t>>& prompts,
                                       const GenerationOptions& options) {
  const BartConfig& config = model.config();
  const int64_t longest = generation::check_prompts(prompts, options, config.vocab_size, config.max_position_embeddings,
                                                    "the encoder's max_position_embeddings is");
  TORCH_CHECK(options.max_new_tokens() <= config.max_position_embeddings, "generate: expected max_new_tokens in [1, ",
              config.max_position_embeddings, "] (the decoder's max_position_embeddings), got ",
              options.max_new_tokens());
  const int64_t batch = static_cast<int64_t>(prompts.size());
  std::vector<int64_t> stop = options.stop_token_ids();
  if (options.stop_at_eos()) stop.insert(stop.end(), config.eos_token_ids.begin(), config.eos_token_ids.end());
  generation::GenerationSteps steps(prompts, options, std::move(stop));

  c10::InferenceMode inference;
  model.eval();
  const auto device = model.shared->weight.device();

  // Right-padded prompts: positions count from 0 in every row, as alone.
  std::vector<int64_t> flat(static_cast<size_t>(batch * longest), config.pad_token_id);
  std::vector<uint8_t> pad(flat.size(), 1);
  bool padded = false;
  for (int64_t b = 0; b < batch; ++b) {
    const auto& p = prompts[static_cast<size_t>(b)];
    std::copy(p.begin(), p.end(), flat.begin() + b * longest);
    std::fill_n(pad.begin() + b * longest, p.size(), 0);
    padded = padded || static_cast<int64_t>(p.size()) < longest;
  }
  const at::Tensor ids = at::tensor(flat, at::kLong).view({batch, longest}).to(device);
  const at::Tensor mask =
      padded ? at::tensor(at::ArrayRef<uint8_t>(pad), at::kByte).view({batch, longest}).to(device, at::kBool)
             : at::Tensor();

  steps.begin();  // the prefill: the encoder, its keys and values, and the first token
  const std::vector<torchattn::CrossKV> context = model.cross_kvs(model.encode(ids, mask), mask);
  auto caches = model.make_kv_caches(batch);
  at::Tensor next_ids = at::full({batch, 1}, config.decoder_start_token_id,
                                 at::TensorOptions(at::kLong).device(device));
  const int64_t last_step = options.max_new_tokens() - 1;
  for (int64_t i = 0; i <= last_step && !steps.finished(); ++i) {
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
    // A finished sequence goes on with the pad token, whose outputs nobody reads.
    const std::vector<int64_t> next = steps.choose(logits, forced, config.pad_token_id);
    next_ids = at::tensor(next, at::kLong).view({batch, 1}).to(device);
  }
  return steps.results();
}

}  // namespace torchattn::models

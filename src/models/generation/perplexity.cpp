#include <torchattn/models/perplexity.h>

#include "models/generation/finite_logits.h"

#include <ATen/ops/from_blob.h>
#include <ATen/ops/log_softmax.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <string>
#include <vector>

namespace torchattn::models {

PerplexityResult perplexity(CausalLM& model, const std::vector<int64_t>& ids, int64_t context,
                            const std::function<void(int64_t, int64_t)>& progress,
                            const std::function<void(int64_t, const at::Tensor&)>& window_logits) {
  TORCH_CHECK(context >= 2, "perplexity: expected a context of at least 2 tokens, got ", context);
  TORCH_CHECK(context <= model->context_length(), "perplexity: expected a context of at most the model's ",
              model->context_length(), " tokens (its context_length), got ", context);
  const int64_t windows = static_cast<int64_t>(ids.size()) / context;
  TORCH_CHECK(windows >= 1, "perplexity: expected at least one window of ", context, " tokens, got ", ids.size(),
              " tokens");
  // Named by their place in the caller's ids, not in a window.
  const int64_t vocab = model->config().vocab_size;
  for (size_t i = 0; i < ids.size(); ++i) {
    TORCH_CHECK(ids[i] >= 0 && ids[i] < vocab, "perplexity: expected token ids in [0, ", vocab,
                ") (the model's vocab_size), got ", ids[i], " at [", i, "] of the ", ids.size(), " ids");
  }
  c10::InferenceMode inference;
  const at::Device device = model->norm->weight.device();
  double total = 0.0;
  for (int64_t w = 0; w < windows; ++w) {
    // from_blob reads the caller's ids; the copy to the device (or a clone) owns them.
    const at::Tensor window =
        at::from_blob(const_cast<int64_t*>(ids.data()) + w * context, {1, context}, at::kLong).clone().to(device);
    const at::Tensor logits = model->forward(window).narrow(1, 0, context - 1).to(at::kFloat);
    const std::vector<bool> finite = generation::finite_rows(logits[0]);
    for (int64_t t = 0; t < context - 1; ++t) {
      // Named by the token predicted, in the caller's ids.
      TORCH_CHECK(finite[static_cast<size_t>(t)],
                  generation::non_finite_logits("perplexity", w * context + t + 1,
                                                "window " + std::to_string(w + 1) + " of " + std::to_string(windows) +
                                                    ", the logits of ids[" + std::to_string(w * context + t + 1) +
                                                    "]"));
    }
    const at::Tensor logp = at::log_softmax(logits, -1);
    const at::Tensor next = window.narrow(1, 1, context - 1).unsqueeze(-1);
    total -= logp.gather(-1, next).to(at::kDouble).sum().item<double>();
    if (window_logits) window_logits(w, logits[0]);
    if (progress) progress(w + 1, windows);
  }
  PerplexityResult r;
  r.windows = windows;
  r.tokens = windows * (context - 1);
  r.mean_nll = total / static_cast<double>(r.tokens);
  r.perplexity = std::exp(r.mean_nll);
  return r;
}

}  // namespace torchattn::models

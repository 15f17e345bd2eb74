#pragma once

// Perplexity of a decoder over a token sequence, as llama.cpp's and transformers'
// users measure what a weight format costs (apps/perplexity, torchattn_perplexity).
//
//   auto lm = torchattn::models::LanguageModel::from_pretrained(dir);
//   auto ids = lm.tokenizer().encode(text, /*add_special_tokens=*/false);
//   auto r = torchattn::models::perplexity(lm.model(), ids, 512);  // r.perplexity, r.tokens

#include <torchattn/models/causal_lm.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace torchattn::models {

struct PerplexityResult {
  /// exp(mean_nll).
  double perplexity = 0.0;
  /// The mean negative log-likelihood (natural log) of the scored tokens.
  double mean_nll = 0.0;
  /// How many tokens were scored: (context - 1) per window.
  int64_t tokens = 0;
  int64_t windows = 0;
};

/// ids cut into consecutive windows of `context` tokens (a last partial window
/// dropped), each scored alone: the negative log-likelihood of its tokens 2..context
/// given the tokens before them in the window (float64 sums of the model's float32
/// log-softmax), averaged over every scored token. progress(done, total) after each
/// window, if given; window_logits(w, logits) too, with window w's (0-based) float32
/// logits [context - 1, vocab_size] on the model's device (row t predicts the window's
/// token t + 1), for a caller that keeps the distributions (torchattn_perplexity
/// --save-logits, a KL divergence between formats). Errors: context < 2, fewer ids than
/// one window, a context past the model's context_length.
PerplexityResult perplexity(CausalLM& model, const std::vector<int64_t>& ids, int64_t context,
                            const std::function<void(int64_t, int64_t)>& progress = {},
                            const std::function<void(int64_t, const at::Tensor&)>& window_logits = {});

}  // namespace torchattn::models

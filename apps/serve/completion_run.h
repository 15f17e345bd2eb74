#pragma once

// One completion request between the API and the engine: its prompt as token ids and
// its generation options (checked against the model's context), then the engine's
// events turned into what the client sees (text deltas, token ids, finish_reason,
// usage), the same whether streamed or not.

#include "openai_api.h"
#include "text_stream.h"

#include <torchattn/models/engine.h>
#include <torchattn/models/language_model.h>

#include <cstdint>
#include <string>
#include <vector>

namespace serve {

/// What the engine is asked for.
struct EngineRequest {
  std::vector<int64_t> prompt;
  torchattn::models::GenerationOptions options;
};

/// The prompt (the chat template's text for a conversation), tokenized, and the
/// options: max_tokens (default: the rest of the context for chat, 16 for
/// completions, as OpenAI's), greedy at temperature 0 else sampled (top_p, top_k, the
/// seed or a random one), logit_bias, penalties and logprobs, stopping at the model's
/// EOS and end-of-turn tokens unless ignore_eos. A prompt with no tokens, prompt and
/// max_tokens past the context, or a logit_bias id past the vocabulary is an ApiError
/// (400) naming the numbers.
EngineRequest prepare(const CompletionRequest& request, const torchattn::models::LanguageModel& model);

/// The token ids whose text is never shown: EOS and the end of a turn.
std::vector<int64_t> hidden_tokens(const torchattn::models::LanguageModel& model);

struct Delta {
  std::string text;
  std::vector<int64_t> ids;
  std::vector<LogprobEntry> logprobs;  // with request.logprobs >= 0: one per shown token
};

class CompletionRun {
 public:
  /// prompt: the request's prompt ids (its count in the usage; its last token the text's
  /// context: the answer is the text its tokens add after the prompt).
  CompletionRun(const CompletionRequest& request, const torchattn::models::LanguageModel& model,
                const std::vector<int64_t>& prompt);

  /// Applies an engine event; returns what the client sees of it. Once done(), the
  /// answer is complete; when a stop sequence ended it, cancel_engine() is true (the
  /// engine still runs the request).
  Delta apply(const torchattn::models::TokenEvent& event);

  bool done() const { return !finish_reason_.empty(); }
  bool cancel_engine() const { return cancel_engine_; }
  /// "stop" or "length" once done; "error" where the engine could not go on.
  const std::string& finish_reason() const { return finish_reason_; }
  /// With finish_reason() "error": the engine's words (the model's logits were not
  /// finite: damaged weights), for the answer's error.
  const std::string& error() const { return error_; }
  const std::string& text() const { return text_.text(); }
  const std::vector<int64_t>& ids() const { return ids_; }
  /// One entry per generated token but the hidden ones (EOS, end of turn), when the
  /// request asked for logprobs.
  const std::vector<LogprobEntry>& logprobs() const { return logprobs_; }
  Usage usage() const { return usage_; }

 private:
  const torchattn::models::Tokenizer& tokenizer_;
  std::vector<int64_t> hidden_;
  TextStream text_;
  std::vector<int64_t> ids_;
  std::vector<LogprobEntry> logprobs_;
  int64_t logprob_text_bytes_ = 0;  // the text of the tokens with logprob entries so far
  Usage usage_;
  std::string finish_reason_;
  std::string error_;
  bool cancel_engine_ = false;
};

}  // namespace serve

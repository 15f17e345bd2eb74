#include "completion_run.h"

#include <algorithm>
#include <random>

namespace serve {

namespace models = torchattn::models;

std::vector<int64_t> hidden_tokens(const models::LanguageModel& model) {
  std::vector<int64_t> ids = model.config().eos_token_ids;
  if (model.end_of_turn()) ids.push_back(*model.end_of_turn());
  return ids;
}

EngineRequest prepare(const CompletionRequest& request, const models::LanguageModel& model) {
  std::string text = request.prompt;
  if (request.chat) {
    if (!model.has_chat_template()) {
      throw bad_request("this model has no chat template: use /v1/completions with a prompt", "messages");
    }
    text = model.chat_prompt(request.messages);
  }
  EngineRequest out;
  out.prompt = model.tokenizer().encode(text);
  const char* field = request.chat ? "messages" : "prompt";
  const auto n = static_cast<int64_t>(out.prompt.size());
  if (n == 0) throw bad_request(std::string("'") + field + "' has no tokens", field);
  const int64_t context = model.model()->context_length();
  if (n >= context) {
    throw bad_request("This model's maximum context length is " + std::to_string(context) + " tokens; the prompt has " +
                          std::to_string(n) + " (with no room left for an answer)",
                      field, "context_length_exceeded");
  }
  const int64_t max_tokens = request.max_tokens.value_or(request.chat ? context - n
                                                                      : std::min<int64_t>(16, context - n));
  if (n + max_tokens > context) {
    throw bad_request("This model's maximum context length is " + std::to_string(context) + " tokens; the prompt has " +
                          std::to_string(n) + " and max_tokens asks for " + std::to_string(max_tokens) + " more",
                      request.max_tokens_field, "context_length_exceeded");
  }
  if (request.ignore_eos) {
    out.options.max_new_tokens(max_tokens).stop_at_eos(false);
  } else {
    out.options.max_new_tokens(max_tokens).stop_token_ids(hidden_tokens(model)).stop_at_eos(true);
  }
  const int64_t vocab = model.model()->config().vocab_size;
  for (const auto& [id, bias] : request.logit_bias) {
    if (id >= vocab) {
      throw bad_request("'logit_bias' names token " + std::to_string(id) + ", past the vocabulary of " +
                            std::to_string(vocab) + " tokens",
                        "logit_bias");
    }
  }
  out.options.logit_bias(request.logit_bias)
      .presence_penalty(request.presence_penalty)
      .frequency_penalty(request.frequency_penalty)
      .logprobs(request.logprobs);
  if (request.temperature > 0.0) {
    static thread_local std::mt19937_64 seeds{std::random_device{}()};
    out.options.do_sample(true)
        .temperature(request.temperature)
        .top_p(request.top_p)
        .top_k(request.top_k)
        .seed(request.seed.value_or(seeds()));
  }
  return out;
}

CompletionRun::CompletionRun(const CompletionRequest& request, const models::LanguageModel& model,
                             const std::vector<int64_t>& prompt)
    : tokenizer_(model.tokenizer()), hidden_(hidden_tokens(model)),
      text_(model.tokenizer(), hidden_, request.stop,
            prompt.empty() ? std::vector<int64_t>() : std::vector<int64_t>{prompt.back()}) {
  usage_.prompt_tokens = static_cast<int64_t>(prompt.size());
}

Delta CompletionRun::apply(const models::TokenEvent& event) {
  Delta delta;
  if (done()) return delta;
  if (event.token) {
    ids_.push_back(*event.token);
    delta.ids.push_back(*event.token);
    usage_.completion_tokens = event.generated;
    delta.text = text_.push(*event.token);
    if (event.logprobs && std::find(hidden_.begin(), hidden_.end(), *event.token) == hidden_.end()) {
      LogprobEntry entry;
      entry.chosen = {tokenizer_.token_text(event.logprobs->chosen.token), event.logprobs->chosen.logprob};
      for (const auto& t : event.logprobs->top) entry.top.push_back({tokenizer_.token_text(t.token), t.logprob});
      entry.text_offset = logprob_text_bytes_;  // the tokens' text before it, held back or not
      logprob_text_bytes_ += static_cast<int64_t>(entry.chosen.text.size());
      delta.logprobs.push_back(entry);
      logprobs_.push_back(std::move(entry));
    }
    if (text_.stopped()) {
      finish_reason_ = "stop";
      cancel_engine_ = !event.finished.has_value();
      return delta;
    }
  }
  if (event.finished && *event.finished == models::FinishReason::Error) {
    finish_reason_ = "error";
    error_ = event.error;
  } else if (event.finished) {
    delta.text += text_.finish();
    finish_reason_ = *event.finished == models::FinishReason::Length ? "length" : "stop";
  }
  return delta;
}

}  // namespace serve

#pragma once

// The OpenAI API's wire format, as torchattn_serve speaks it: requests of
// POST /v1/chat/completions and /v1/completions parsed and checked (each bad field an
// ApiError naming it), and the JSON of responses, stream chunks, model lists and
// errors. No HTTP and no model here.

#include <torchattn/models/chat.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace serve {

/// An error as the API returns it: an HTTP status and
/// {"error": {"message", "type", "param", "code"}}.
struct ApiError : std::runtime_error {
  ApiError(int status, std::string type, const std::string& message, std::string param = "", std::string code = "")
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)),
        code(std::move(code)) {}
  int status;
  std::string type;   // invalid_request_error, authentication_error, not_found_error, unavailable_error, ...
  std::string param;  // the request field it is about, or ""
  std::string code;   // context_length_exceeded, model_not_found, ..., or ""
};

/// A 400 invalid_request_error about `param`.
ApiError bad_request(const std::string& message, const std::string& param = "", const std::string& code = "");

/// {"error": {...}} of `e`.
std::string error_json(const ApiError& e);

/// A request of either endpoint, checked.
struct CompletionRequest {
  bool chat = false;
  std::string model;
  std::vector<torchattn::models::ChatMessage> messages;  // chat
  std::string prompt;                                    // completions
  std::optional<int64_t> max_tokens;            // max_completion_tokens, else max_tokens; unset: the endpoint's default
  std::string max_tokens_field = "max_tokens";  // which of the two gave it
  double temperature = 1.0;                     // [0, 2]; 0 is greedy
  double top_p = 1.0;                           // (0, 1]
  int64_t top_k = 0;                            // >= 0 (an extension, as llama.cpp's and vLLM's)
  std::optional<uint64_t> seed;
  bool stream = false;
  bool include_usage = false;                          // stream_options.include_usage
  std::vector<std::string> stop;                       // at most 4, each non-empty
  bool return_token_ids = false;                       // an extension: the generated token ids in each choice / chunk
  bool ignore_eos = false;                             // an extension (as vLLM's): go on past EOS and the end of a turn
  std::vector<std::pair<int64_t, double>> logit_bias;  // (token id, bias in [-100, 100])
  double presence_penalty = 0.0;                       // [-2, 2]
  double frequency_penalty = 0.0;                      // [-2, 2]
  /// -1: no log-probabilities; else they come with each token, with this many most
  /// likely alternatives (chat: logprobs true and top_logprobs in [0, 20]; completions:
  /// logprobs in [0, 5]).
  int64_t logprobs = -1;
};

/// The fields of OpenAI's request schemas that this server accepts without effect
/// (with the values given here), for docs and tests: user, safety_identifier,
/// prompt_cache_key (prefix caching is automatic), metadata, service_tier auto/default,
/// store false, parallel_tool_calls, modalities ["text"], response_format
/// {"type": "text"}, tool_choice "none", best_of 1, echo false.
/// Every other field of the schemas that the server does not honour is a 400 naming
/// it; fields outside the schemas are ignored, as OpenAI's API ignores them.

/// Route of a request: which handler answers METHOD PATH.
enum class Route { ChatCompletions, Completions, Models, Health, Stats };

/// The route of `method` `path`; an ApiError 404 (no such path) or 405 (a path of
/// another method) otherwise.
Route route_of(const std::string& method, const std::string& path);

/// Parses the body of POST /v1/chat/completions (chat) or /v1/completions. Malformed
/// JSON, a number past what a double or an integer holds, a missing or mistyped
/// field, a value out of range, an empty prompt or conversation, n other than 1, or a
/// field of OpenAI's schema that this server does not honour (tools, echo, suffix,
/// response_format other than text, ..., see above) is an ApiError (400) naming the
/// field. Fields outside the schema are ignored. Throws ApiError only.
CompletionRequest parse_completion_request(const std::string& body, bool chat);

/// A token's text (its bytes, which may end inside a UTF-8 character) and
/// log-probability, for the logprobs of a response.
struct LogprobToken {
  std::string text;
  double logprob = 0.0;
};
struct LogprobEntry {
  LogprobToken chosen;
  std::vector<LogprobToken> top;
  int64_t text_offset = 0;  // bytes of the answer's tokens' text before this token
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

/// The non-streamed response (chat.completion or text_completion).
std::string completion_json(const CompletionRequest& request, const std::string& id, int64_t created,
                            const std::string& model, const std::string& text, const std::string& finish_reason,
                            const Usage& usage, const std::vector<int64_t>& token_ids,
                            const std::vector<LogprobEntry>& logprobs = {});

/// One stream chunk (chat.completion.chunk or text_completion) as an SSE event,
/// "data: {...}\n\n". role: the chat's first chunk (delta.role = assistant); finish:
/// the last chunk's finish_reason, or "" while going on.
std::string chunk_event(const CompletionRequest& request, const std::string& id, int64_t created,
                        const std::string& model, const std::string& text, const std::string& finish_reason, bool role,
                        const std::vector<int64_t>& token_ids, const std::vector<LogprobEntry>& logprobs = {});

/// The usage chunk of stream_options.include_usage (choices empty), as an SSE event.
std::string usage_event(const CompletionRequest& request, const std::string& id, int64_t created,
                        const std::string& model, const Usage& usage);

/// An error inside a stream, as an SSE event (the client raises it).
std::string error_event(const ApiError& e);

/// GET /v1/models.
std::string models_json(const std::string& model, int64_t created, int64_t context_length);

}  // namespace serve

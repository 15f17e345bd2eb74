#include "openai_api.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>

namespace serve {

namespace {

using json = nlohmann::json;

const char* kind_of(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "an integer";
    case json::value_t::number_float:
      return "a number";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    default:
      return "something else";
  }
}

// nlohmann's message without its "[json.exception.parse_error.101] " prefix.
std::string without_id(const std::string& what) {
  const size_t end = what.rfind("] ", what.find(' ') == std::string::npos ? 0 : what.find(' '));
  return what.rfind("[json.exception.", 0) == 0 && end != std::string::npos ? what.substr(end + 2) : what;
}

// A field that is absent or null counts as not given, as the API treats them.
bool given(const json& body, const char* field) { return body.contains(field) && !body[field].is_null(); }

ApiError wrong_type(const std::string& field, const char* expected, const json& v) {
  return bad_request("'" + field + "' must be " + expected + ", got " + kind_of(v), field);
}

int64_t get_int(const json& body, const char* field, int64_t lo, int64_t hi) {
  const json& v = body[field];
  if (!v.is_number_integer()) throw wrong_type(field, "an integer", v);
  // An unsigned integer past int64's range is out of range too (printed as given).
  const bool fits = !v.is_number_unsigned() || v.get<uint64_t>() <= static_cast<uint64_t>(hi);
  const int64_t x = fits ? v.get<int64_t>() : hi;
  if (!fits || x < lo || x > hi) {
    throw bad_request("'" + std::string(field) + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                          "], got " + v.dump(),
                      field);
  }
  return x;
}

double get_number(const json& body, const char* field, double lo, double hi, bool lo_open) {
  const json& v = body[field];
  if (!v.is_number()) throw wrong_type(field, "a number", v);
  const double x = v.get<double>();
  if (!std::isfinite(x) || x > hi || (lo_open ? x <= lo : x < lo)) {
    throw bad_request("'" + std::string(field) + "' must be in " + (lo_open ? "(" : "[") + json(lo).dump() + ", " +
                          json(hi).dump() + "], got " + v.dump(),
                      field);
  }
  return x;
}

bool get_bool(const json& body, const char* field) {
  const json& v = body[field];
  if (!v.is_boolean()) throw wrong_type(field, "a boolean", v);
  return v.get<bool>();
}

// Fields of OpenAI's chat request schema that this server does not honour: any value
// but null is a 400 naming the field.
constexpr const char* kChatUnhonoured[] = {
    "audio", "function_call", "functions", "prediction", "reasoning_effort", "verbosity", "web_search_options"};

template <size_t N>
void refuse_unhonoured(const json& body, const char* const (&fields)[N]) {
  for (const char* field : fields) {
    if (given(body, field)) throw bad_request("'" + std::string(field) + "' is not supported by this server", field);
  }
}

// {"<token id>": bias in [-100, 100], ...}
std::vector<std::pair<int64_t, double>> get_logit_bias(const json& v) {
  if (!v.is_object()) throw wrong_type("logit_bias", "an object of token ids to numbers", v);
  if (v.size() > 300) {
    throw bad_request("'logit_bias' takes at most 300 tokens, got " + std::to_string(v.size()), "logit_bias");
  }
  std::vector<std::pair<int64_t, double>> out;
  for (const auto& [key, bias] : v.items()) {
    const std::string where = "logit_bias." + key;
    int64_t id = -1;
    // Digits without leading zeros: "01" would be a second name of token 1.
    const bool digits = !key.empty() && key.size() <= 10 && key.find_first_not_of("0123456789") == std::string::npos &&
                        (key == "0" || key[0] != '0');
    if (digits) id = std::stoll(key);
    if (!digits || id > std::numeric_limits<int32_t>::max()) {
      throw bad_request("'logit_bias' keys must be token ids (integers >= 0 as strings, no leading zeros), got '" +
                            key + "'",
                        "logit_bias");
    }
    if (!bias.is_number()) throw wrong_type(where, "a number", bias);
    const double b = bias.get<double>();
    if (!std::isfinite(b) || b < -100.0 || b > 100.0) {
      throw bad_request("'" + where + "' must be in [-100, 100], got " + bias.dump(), "logit_bias");
    }
    out.emplace_back(id, b);
  }
  return out;
}

// A message's content: a string, or an array of text parts.
std::string content_text(const json& content, const std::string& field) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw wrong_type(field, "a string or an array of text parts", content);
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    const std::string where = field + "[" + std::to_string(i) + "]";
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
      throw bad_request("'" + where +
                            "' must be a text part {\"type\": \"text\", \"text\": ...}; this server takes "
                            "text only",
                        where);
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

json usage_object(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

std::string event(const json& j) { return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n"; }

}  // namespace

ApiError bad_request(const std::string& message, const std::string& param, const std::string& code) {
  return ApiError(400, "invalid_request_error", message, param, code);
}

std::string error_json(const ApiError& e) {
  json err = {{"message", e.what()}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return json{{"error", err}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

CompletionRequest parse_completion_request(const std::string& text, bool chat) {
  json body;
  try {
    body = json::parse(text);
  } catch (const json::out_of_range& e) {
    // A number past a double's range (1e309).
    throw bad_request("the body has a number out of range: " + without_id(e.what()));
  } catch (const json::exception& e) {
    throw bad_request("the body is not valid JSON: " + without_id(e.what()));
  }
  if (!body.is_object()) throw bad_request(std::string("the body must be a JSON object, got ") + kind_of(body));
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  CompletionRequest r;
  r.chat = chat;
  if (!given(body, "model")) throw bad_request("'model' is required", "model");
  if (!body["model"].is_string()) throw wrong_type("model", "a string", body["model"]);
  r.model = body["model"].get<std::string>();
  if (chat) {
    if (!given(body, "messages")) throw bad_request("'messages' is required", "messages");
    const json& messages = body["messages"];
    if (!messages.is_array()) throw wrong_type("messages", "an array", messages);
    if (messages.empty()) throw bad_request("'messages' is empty: give at least one message", "messages");
    for (size_t i = 0; i < messages.size(); ++i) {
      const std::string where = "messages[" + std::to_string(i) + "]";
      const json& m = messages[i];
      if (!m.is_object()) throw wrong_type(where, "an object", m);
      if (!m.contains("role") || !m["role"].is_string()) {
        throw bad_request("'" + where + ".role' is required, a string", where + ".role");
      }
      const std::string role = m["role"].get<std::string>();
      if (role != "system" && role != "user" && role != "assistant" && role != "developer") {
        throw bad_request("'" + where + ".role' must be system, developer, user or assistant, got '" + role + "'",
                          where + ".role");
      }
      if (!m.contains("content") || m["content"].is_null()) {
        throw bad_request("'" + where + ".content' is required", where + ".content");
      }
      r.messages.push_back({role == "developer" ? "system" : role, content_text(m["content"], where + ".content")});
    }
    if (given(body, "tools")) throw bad_request("'tools' are not supported by this server", "tools");
    if (given(body, "tool_choice") && body["tool_choice"] != "none") {
      throw bad_request("'tool_choice' is not supported by this server (no tools)", "tool_choice");
    }
    refuse_unhonoured(body, kChatUnhonoured);
    if (given(body, "modalities") && body["modalities"] != json::array({"text"})) {
      throw bad_request("'modalities' must be [\"text\"]: this server answers with text only", "modalities");
    }
    if (given(body, "response_format") && body["response_format"] != json{{"type", "text"}}) {
      throw bad_request("'response_format' is not supported by this server (only {\"type\": \"text\"}): no JSON "
                        "mode or schema",
                        "response_format");
    }
    if (given(body, "parallel_tool_calls") && !body["parallel_tool_calls"].is_boolean()) {
      throw wrong_type("parallel_tool_calls", "a boolean", body["parallel_tool_calls"]);
    }
    if (given(body, "logprobs") && get_bool(body, "logprobs")) {
      r.logprobs = given(body, "top_logprobs") ? get_int(body, "top_logprobs", 0, 20) : 0;
    } else if (given(body, "top_logprobs")) {
      throw bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
    }
  } else {
    if (!given(body, "prompt")) throw bad_request("'prompt' is required", "prompt");
    const json& prompt = body["prompt"];
    if (prompt.is_array()) {
      if (prompt.size() != 1 || !prompt[0].is_string()) {
        throw bad_request("'prompt' must be a string (or an array of one string): several prompts or token ids are "
                          "not supported",
                          "prompt");
      }
      r.prompt = prompt[0].get<std::string>();
    } else if (prompt.is_string()) {
      r.prompt = prompt.get<std::string>();
    } else {
      throw wrong_type("prompt", "a string", prompt);
    }
    if (r.prompt.empty()) throw bad_request("'prompt' is empty", "prompt");
    if (given(body, "echo") && get_bool(body, "echo")) throw bad_request("'echo' is not supported", "echo");
    if (given(body, "suffix")) throw bad_request("'suffix' is not supported", "suffix");
    if (given(body, "best_of") && get_int(body, "best_of", 1, kIntMax) != 1) {
      throw bad_request("'best_of' must be 1: this server generates one answer per request", "best_of");
    }
    if (given(body, "logprobs")) r.logprobs = get_int(body, "logprobs", 0, 5);
  }
  if (given(body, "max_completion_tokens")) {
    r.max_tokens = get_int(body, "max_completion_tokens", 1, kIntMax);
    r.max_tokens_field = "max_completion_tokens";
    // The same limit under its older name: given both, they must agree.
    if (given(body, "max_tokens")) {
      const int64_t older = get_int(body, "max_tokens", 1, kIntMax);
      if (older != *r.max_tokens) {
        throw bad_request("'max_tokens' and 'max_completion_tokens' are the same limit ('max_tokens' its older "
                          "name): give one, got " +
                              std::to_string(older) + " and " + std::to_string(*r.max_tokens),
                          "max_completion_tokens");
      }
    }
  } else if (given(body, "max_tokens")) {
    r.max_tokens = get_int(body, "max_tokens", 1, kIntMax);
  }
  if (given(body, "temperature")) r.temperature = get_number(body, "temperature", 0.0, 2.0, false);
  if (given(body, "top_p")) r.top_p = get_number(body, "top_p", 0.0, 1.0, true);
  if (given(body, "top_k")) r.top_k = get_int(body, "top_k", 0, kIntMax);
  if (given(body, "seed")) {
    // OpenAI's range, a signed 64-bit integer; a negative seed is a seed like any other
    // (its 64 bits seed the sampler). JSON integers past 64 bits arrive as floats.
    const json& v = body["seed"];
    const char* range = "an integer in [-9223372036854775808, 9223372036854775807] (64 bits)";
    if (v.is_number_float() && std::isfinite(v.get<double>()) && std::trunc(v.get<double>()) == v.get<double>() &&
        std::fabs(v.get<double>()) >= 9.2e18) {
      throw bad_request(std::string("'seed' must be ") + range + ", got " + v.dump(), "seed");
    }
    if (!v.is_number_integer()) throw wrong_type("seed", range, v);
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw bad_request(std::string("'seed' must be ") + range + ", got " + v.dump(), "seed");
    }
    r.seed = static_cast<uint64_t>(v.get<int64_t>());
  }
  if (given(body, "n") && get_int(body, "n", 1, kIntMax) != 1) {
    throw bad_request("'n' must be 1: this server returns one choice per request", "n");
  }
  if (given(body, "stream")) r.stream = get_bool(body, "stream");
  if (given(body, "stream_options")) {
    const json& o = body["stream_options"];
    if (!o.is_object()) throw wrong_type("stream_options", "an object", o);
    if (!r.stream) throw bad_request("'stream_options' is only allowed with stream: true", "stream_options");
    if (given(o, "include_usage")) {
      if (!o["include_usage"].is_boolean())
        throw wrong_type("stream_options.include_usage", "a boolean", o["include_usage"]);
      r.include_usage = o["include_usage"].get<bool>();
    }
  }
  if (given(body, "stop")) {
    const json& s = body["stop"];
    if (s.is_string()) {
      r.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      if (s.size() > 4) throw bad_request("'stop' takes at most 4 sequences, got " + std::to_string(s.size()), "stop");
      for (const json& x : s) {
        if (!x.is_string()) throw wrong_type("stop", "a string or an array of strings", x);
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      throw wrong_type("stop", "a string or an array of strings", s);
    }
    for (const auto& x : r.stop) {
      if (x.empty()) throw bad_request("'stop' sequences must not be empty", "stop");
    }
  }
  if (given(body, "presence_penalty")) r.presence_penalty = get_number(body, "presence_penalty", -2.0, 2.0, false);
  if (given(body, "frequency_penalty")) r.frequency_penalty = get_number(body, "frequency_penalty", -2.0, 2.0, false);
  if (given(body, "logit_bias")) r.logit_bias = get_logit_bias(body["logit_bias"]);
  if (given(body, "service_tier") && body["service_tier"] != "auto" && body["service_tier"] != "default") {
    throw bad_request("'service_tier' must be auto or default: this server has one tier", "service_tier");
  }
  if (given(body, "store") && get_bool(body, "store")) {
    throw bad_request("'store' must be false: this server stores no completions", "store");
  }
  for (const char* field : {"user", "safety_identifier", "prompt_cache_key"}) {
    if (given(body, field) && !body[field].is_string()) throw wrong_type(field, "a string", body[field]);
  }
  if (given(body, "metadata") && !body["metadata"].is_object()) {
    throw wrong_type("metadata", "an object of strings", body["metadata"]);
  }
  if (given(body, "return_token_ids")) r.return_token_ids = get_bool(body, "return_token_ids");
  if (given(body, "ignore_eos")) r.ignore_eos = get_bool(body, "ignore_eos");
  return r;
}

Route route_of(const std::string& method, const std::string& path) {
  struct Entry {
    const char* method;
    const char* path;
    Route route;
  };
  static constexpr Entry kRoutes[] = {{"POST", "/v1/chat/completions", Route::ChatCompletions},
                                      {"POST", "/v1/completions", Route::Completions},
                                      {"GET", "/v1/models", Route::Models},
                                      {"GET", "/health", Route::Health},
                                      {"GET", "/stats", Route::Stats}};
  std::string allowed;
  for (const Entry& e : kRoutes) {
    if (path != e.path) continue;
    if (method == e.method) return e.route;
    allowed = e.method;
  }
  if (!allowed.empty()) {
    throw ApiError(405, "invalid_request_error", method + " " + path + " is not allowed: use " + allowed);
  }
  throw ApiError(404, "not_found_error", "no route " + method + " " + path);
}

namespace {

// The UTF-8 bytes of a token, as OpenAI's "bytes".
json bytes_of(const std::string& text) {
  json out = json::array();
  for (const char c : text) out.push_back(static_cast<unsigned char>(c));
  return out;
}

// chat: {"content": [{token, logprob, bytes, top_logprobs: [...]}, ...], "refusal": null}
json chat_logprobs(const std::vector<LogprobEntry>& entries) {
  json content = json::array();
  for (const auto& e : entries) {
    json top = json::array();
    for (const auto& t : e.top) top.push_back({{"token", t.text}, {"logprob", t.logprob}, {"bytes", bytes_of(t.text)}});
    content.push_back({{"token", e.chosen.text},
                       {"logprob", e.chosen.logprob},
                       {"bytes", bytes_of(e.chosen.text)},
                       {"top_logprobs", top}});
  }
  return {{"content", content}, {"refusal", nullptr}};
}

// `text` with every byte that is not part of valid UTF-8 replaced by U+FFFD, as the
// JSON output shows it (so that two keys that print the same are one).
std::string printable(const std::string& text) {
  return json::parse(json(text).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>();
}

// completions: {"tokens", "token_logprobs", "top_logprobs": [{text: logprob}], "text_offset"};
// each top_logprobs dict holds the `logprobs` most likely tokens and the chosen one, as
// OpenAI's ("up to logprobs + 1 elements").
json text_logprobs(const std::vector<LogprobEntry>& entries) {
  json tokens = json::array(), values = json::array(), tops = json::array(), offsets = json::array();
  for (const auto& e : entries) {
    tokens.push_back(e.chosen.text);
    values.push_back(e.chosen.logprob);
    json top = json::object();
    for (const auto& t : e.top) {
      const std::string key = printable(t.text);
      if (!top.contains(key)) top[key] = t.logprob;
    }
    const std::string chosen = printable(e.chosen.text);
    if (!top.contains(chosen)) top[chosen] = e.chosen.logprob;
    tops.push_back(top);
    offsets.push_back(e.text_offset);
  }
  return {{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json logprobs_of(const CompletionRequest& request, const std::vector<LogprobEntry>& entries) {
  if (request.logprobs < 0) return nullptr;
  return request.chat ? chat_logprobs(entries) : text_logprobs(entries);
}

}  // namespace

std::string completion_json(const CompletionRequest& request, const std::string& id, int64_t created,
                            const std::string& model, const std::string& text, const std::string& finish_reason,
                            const Usage& usage, const std::vector<int64_t>& token_ids,
                            const std::vector<LogprobEntry>& logprobs) {
  json choice = {{"index", 0}, {"finish_reason", finish_reason}, {"logprobs", logprobs_of(request, logprobs)}};
  if (request.chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  if (request.return_token_ids) choice["token_ids"] = token_ids;
  json out = {{"id", id},
              {"object", request.chat ? "chat.completion" : "text_completion"},
              {"created", created},
              {"model", model},
              {"choices", json::array({choice})},
              {"usage", usage_object(usage)}};
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string chunk_event(const CompletionRequest& request, const std::string& id, int64_t created,
                        const std::string& model, const std::string& text, const std::string& finish_reason, bool role,
                        const std::vector<int64_t>& token_ids, const std::vector<LogprobEntry>& logprobs) {
  json choice = {{"index", 0}, {"logprobs", logprobs.empty() ? json(nullptr) : logprobs_of(request, logprobs)}};
  choice["finish_reason"] = finish_reason.empty() ? json(nullptr) : json(finish_reason);
  if (request.chat) {
    json delta = json::object();
    if (role) delta["role"] = "assistant";
    if (role || !text.empty()) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  if (request.return_token_ids) choice["token_ids"] = token_ids;
  json out = {{"id", id},
              {"object", request.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", model},
              {"choices", json::array({choice})}};
  if (request.include_usage) out["usage"] = nullptr;
  return event(out);
}

std::string usage_event(const CompletionRequest& request, const std::string& id, int64_t created,
                        const std::string& model, const Usage& usage) {
  return event({{"id", id},
                {"object", request.chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created},
                {"model", model},
                {"choices", json::array()},
                {"usage", usage_object(usage)}});
}

std::string error_event(const ApiError& e) { return "data: " + error_json(e) + "\n\n"; }

std::string models_json(const std::string& model, int64_t created, int64_t context_length) {
  return json{{"object", "list"},
              {"data", json::array({{{"id", model},
                                     {"object", "model"},
                                     {"created", created},
                                     {"owned_by", "torchattn"},
                                     {"max_model_len", context_length}}})}}
      .dump();
}

}  // namespace serve

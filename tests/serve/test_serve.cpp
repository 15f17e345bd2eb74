// torchattn_serve's protocol and text, without a model or a socket: requests parsed
// with their defaults and every bad field an ApiError naming it; the JSON of
// responses, chunks and errors as OpenAI's clients read it; and TextStream: whole UTF-8
// characters, hidden stop tokens, and stop sequences held back until they are known
// (the streamed pieces always add up to the whole text).

#include "completion_run.h"
#include "openai_api.h"
#include "text_stream.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace {

using nlohmann::json;

serve::CompletionRequest parse(const json& body, bool chat = true) {
  return serve::parse_completion_request(body.dump(), chat);
}

// The ApiError `body` gets: its status and what its message and param say.
void expect_bad(const std::string& body, bool chat, int status, const std::string& needle) {
  try {
    serve::parse_completion_request(body, chat);
    ADD_FAILURE() << "accepted: " << body;
  } catch (const serve::ApiError& e) {
    EXPECT_EQ(e.status, status) << body;
    EXPECT_TRUE(std::string(e.what()).find(needle) != std::string::npos || e.param == needle)
        << body << " -> " << e.what() << " (param " << e.param << ")";
    const auto j = json::parse(serve::error_json(e));
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_EQ(j["error"]["message"], e.what());
  }
}

TEST(ServeApi, ParsesRequestsWithTheApisDefaults) {
  const json msgs = json::array(
      {{{"role", "system"}, {"content", "Be brief."}},
       {{"role", "user"},
        {"content", json::array({{{"type", "text"}, {"text", "Hi "}}, {{"type", "text"}, {"text", "there"}}})}},
       {{"role", "developer"}, {"content", "x"}}});
  const auto r = parse({{"model", "m"}, {"messages", msgs}, {"unknown_field", 1}, {"max_tokens", nullptr}});
  EXPECT_TRUE(r.chat);
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[1].content, "Hi there");
  EXPECT_EQ(r.messages[2].role, "system");  // developer is the system role
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_EQ(r.temperature, 1.0);
  EXPECT_FALSE(r.stream);
  const auto c = parse({{"model", "m"},
                        {"prompt", json::array({"once"})},
                        {"max_completion_tokens", 5},
                        {"max_tokens", 5},
                        {"temperature", 0},
                        {"top_p", 0.5},
                        {"top_k", 7},
                        {"seed", 3},
                        {"stream", true},
                        {"stream_options", {{"include_usage", true}}},
                        {"stop", "END"},
                        {"n", 1},
                        {"return_token_ids", true},
                        {"ignore_eos", true}},
                       false);
  EXPECT_EQ(c.prompt, "once");
  EXPECT_EQ(*c.max_tokens, 5);  // both given, equal
  EXPECT_EQ(c.max_tokens_field, "max_completion_tokens");
  EXPECT_EQ(c.top_k, 7);
  EXPECT_EQ(*c.seed, 3u);
  // A negative seed is one of OpenAI's: its 64 bits seed the sampler (docs/serving.md).
  const auto negative = parse({{"model", "m"}, {"messages", msgs}, {"seed", -1}});
  EXPECT_EQ(*negative.seed, ~uint64_t{0});
  EXPECT_TRUE(c.stream && c.include_usage && c.return_token_ids && c.ignore_eos);
  EXPECT_EQ(c.stop, (std::vector<std::string>{"END"}));
}

TEST(ServeApi, EveryBadFieldIsAnErrorNamingIt) {
  const std::string m = R"("model": "m", "messages": [{"role": "user", "content": "hi"}])";
  expect_bad("{oops", true, 400, "not valid JSON");
  expect_bad("[]", true, 400, "must be a JSON object, got an array");
  expect_bad(R"({"messages": []})", true, 400, "'model' is required");
  expect_bad(R"({"model": 3, "messages": []})", true, 400, "'model' must be a string, got an integer");
  expect_bad(R"({"model": "m"})", true, 400, "'messages' is required");
  expect_bad(R"({"model": "m", "messages": {}})", true, 400, "'messages' must be an array, got an object");
  expect_bad(R"({"model": "m", "messages": []})", true, 400, "'messages' is empty");
  expect_bad(R"({"model": "m", "messages": [{"content": "x"}]})", true, 400, "messages[0].role");
  expect_bad(R"({"model": "m", "messages": [{"role": "tool", "content": "x"}]})", true, 400, "got 'tool'");
  expect_bad(R"({"model": "m", "messages": [{"role": "user"}]})", true, 400, "'messages[0].content' is required");
  expect_bad(R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", true, 400,
             "text only");
  expect_bad("{" + m + R"(, "max_tokens": 0})", true, 400, "'max_tokens' must be in [1, 2147483647], got 0");
  expect_bad("{" + m + R"(, "max_tokens": 2.5})", true, 400, "'max_tokens' must be an integer, got a number");
  expect_bad("{" + m + R"(, "temperature": -0.1})", true, 400, "'temperature' must be in [0.0, 2.0]");
  expect_bad("{" + m + R"(, "temperature": "hot"})", true, 400, "'temperature' must be a number, got a string");
  expect_bad("{" + m + R"(, "top_p": 0})", true, 400, "'top_p' must be in (0.0, 1.0], got 0");
  expect_bad("{" + m + R"(, "top_k": -1})", true, 400, "'top_k' must be in [0");
  expect_bad("{" + m + R"(, "seed": "x"})", true, 400,
             "'seed' must be an integer in [-9223372036854775808, "
             "9223372036854775807] (64 bits), got a string");
  // Past 64 bits, unsigned past the signed range, or a JSON number too large for an integer.
  expect_bad("{" + m + R"(, "seed": 18446744073709551615})", true, 400,
             "'seed' must be an integer in [-9223372036854775808, 9223372036854775807] (64 bits), got "
             "18446744073709551615");
  expect_bad(
      "{" + m + R"(, "seed": 123456789012345678901234567890})", true, 400,
      "'seed' must be an integer in [-9223372036854775808, 9223372036854775807] (64 bits), got 1.2345678901234568e+29");
  expect_bad("{" + m + R"(, "max_tokens": 9, "max_completion_tokens": 5})", true, 400,
             "'max_tokens' and 'max_completion_tokens' are the same limit ('max_tokens' its older name): give one, "
             "got 9 and 5");
  expect_bad("{" + m + R"(, "n": 3})", true, 400, "'n' must be 1");
  expect_bad("{" + m + R"(, "stream": "yes"})", true, 400, "'stream' must be a boolean, got a string");
  expect_bad("{" + m + R"(, "stream_options": {"include_usage": true}})", true, 400, "only allowed with stream: true");
  expect_bad("{" + m + R"(, "stop": ["a", "b", "c", "d", "e"]})", true, 400, "at most 4 sequences, got 5");
  expect_bad("{" + m + R"(, "stop": [""]})", true, 400, "must not be empty");
  expect_bad("{" + m + R"(, "stop": 5})", true, 400, "'stop' must be a string or an array of strings");
  expect_bad("{" + m + R"(, "logprobs": "yes"})", true, 400, "'logprobs' must be a boolean, got a string");
  expect_bad("{" + m + R"(, "tools": [{}]})", true, 400, "'tools' are not supported");
  expect_bad(R"({"model": "m"})", false, 400, "'prompt' is required");
  expect_bad(R"({"model": "m", "prompt": ""})", false, 400, "'prompt' is empty");
  expect_bad(R"({"model": "m", "prompt": ["a", "b"]})", false, 400, "several prompts or token ids are not supported");
  expect_bad(R"({"model": "m", "prompt": [1, 2]})", false, 400, "several prompts or token ids are not supported");
  expect_bad(R"({"model": "m", "prompt": "x", "echo": true})", false, 400, "'echo' is not supported");
}

// OpenAI's fields: honoured (logit_bias, penalties, logprobs), accepted without effect
// with the values that have none, and refused (400 naming the field) otherwise.
TEST(ServeApi, SchemaFieldsAreHonouredOrRefusedNeverIgnored) {
  const json msgs = json::array({{{"role", "user"}, {"content", "hi"}}});
  const auto r = parse({{"model", "m"},
                        {"messages", msgs},
                        {"logit_bias", {{"42", -100}, {"7", 5.5}}},
                        {"presence_penalty", 0.5},
                        {"frequency_penalty", -1.25},
                        {"logprobs", true},
                        {"top_logprobs", 3},
                        {"user", "u"},
                        {"safety_identifier", "s"},
                        {"prompt_cache_key", "k"},
                        {"service_tier", "auto"},
                        {"store", false},
                        {"parallel_tool_calls", true},
                        {"modalities", {"text"}},
                        {"response_format", {{"type", "text"}}},
                        {"tool_choice", "none"}});
  EXPECT_EQ(r.logit_bias, (std::vector<std::pair<int64_t, double>>{{42, -100.0}, {7, 5.5}}));
  EXPECT_EQ(r.presence_penalty, 0.5);
  EXPECT_EQ(r.frequency_penalty, -1.25);
  EXPECT_EQ(r.logprobs, 3);
  EXPECT_EQ(parse({{"model", "m"}, {"messages", msgs}, {"logprobs", true}}).logprobs, 0);
  EXPECT_EQ(parse({{"model", "m"}, {"messages", msgs}, {"logprobs", false}}).logprobs, -1);
  EXPECT_EQ(parse({{"model", "m"}, {"messages", msgs}}).logprobs, -1);
  EXPECT_EQ(parse({{"model", "m"}, {"prompt", "x"}, {"logprobs", 5}, {"best_of", 1}}, false).logprobs, 5);

  const std::string m = R"("model": "m", "messages": [{"role": "user", "content": "hi"}])";
  for (const char* field :
       {"audio", "function_call", "functions", "prediction", "reasoning_effort", "verbosity", "web_search_options"}) {
    expect_bad("{" + m + ", \"" + field + "\": {\"x\": 1}}", true, 400,
               std::string("'") + field + "' is not supported");
  }
  expect_bad("{" + m + R"(, "response_format": {"type": "json_object"}})", true, 400, "response_format");
  expect_bad("{" + m + R"(, "metadata": "x"})", true, 400, "'metadata' must be an object of strings");
  expect_bad("{" + m + R"(, "logit_bias": {"01": 1}})", true, 400, "no leading zeros");
  expect_bad("{" + m + R"(, "modalities": ["text", "audio"]})", true, 400, "modalities");
  expect_bad("{" + m + R"(, "tool_choice": "auto"})", true, 400, "tool_choice");
  expect_bad("{" + m + R"(, "service_tier": "flex"})", true, 400, "service_tier");
  expect_bad("{" + m + R"(, "store": true})", true, 400, "'store' must be false");
  expect_bad("{" + m + R"(, "user": 5})", true, 400, "'user' must be a string");
  expect_bad("{" + m + R"(, "top_logprobs": 2})", true, 400, "'top_logprobs' needs 'logprobs': true");
  expect_bad("{" + m + R"(, "logprobs": true, "top_logprobs": 21})", true, 400, "'top_logprobs' must be in [0, 20]");
  expect_bad("{" + m + R"(, "presence_penalty": 2.5})", true, 400, "'presence_penalty' must be in [-2.0, 2.0]");
  expect_bad("{" + m + R"(, "frequency_penalty": "x"})", true, 400, "'frequency_penalty' must be a number");
  expect_bad("{" + m + R"(, "logit_bias": [1]})", true, 400, "'logit_bias' must be an object");
  expect_bad("{" + m + R"(, "logit_bias": {"a": 1}})", true, 400, "keys must be token ids");
  expect_bad("{" + m + R"(, "logit_bias": {"-1": 1}})", true, 400, "keys must be token ids");
  expect_bad("{" + m + R"(, "logit_bias": {"99999999999": 1}})", true, 400, "keys must be token ids");
  expect_bad("{" + m + R"(, "logit_bias": {"1": 101}})", true, 400, "'logit_bias.1' must be in [-100, 100], got 101");
  expect_bad("{" + m + R"(, "logit_bias": {"1": "x"}})", true, 400, "'logit_bias.1' must be a number");
  expect_bad(R"({"model": "m", "prompt": "x", "best_of": 2})", false, 400, "'best_of' must be 1");
  expect_bad(R"({"model": "m", "prompt": "x", "logprobs": 6})", false, 400, "'logprobs' must be in [0, 5], got 6");
  expect_bad(R"({"model": "m", "prompt": "x", "logprobs": true})", false, 400, "'logprobs' must be an integer");
}

// Numbers past what their field's type holds are 400s that print them as given,
// never a 500 or a wrapped value.
TEST(ServeApi, OverflowingNumbersAreRequestErrorsPrintedAsGiven) {
  const std::string m = R"("model": "m", "messages": [{"role": "user", "content": "hi"}])";
  expect_bad("{" + m + R"(, "max_tokens": 9223372036854775808})", true, 400,
             "'max_tokens' must be in [1, 2147483647], got 9223372036854775808");
  expect_bad("{" + m + R"(, "max_tokens": 18446744073709551615})", true, 400, "got 18446744073709551615");
  expect_bad("{" + m + R"(, "max_tokens": 18446744073709551616})", true, 400, "'max_tokens' must be an integer");
  expect_bad("{" + m + R"(, "max_tokens": -9223372036854775809})", true, 400, "'max_tokens' must be an integer");
  expect_bad("{" + m + R"(, "top_k": 9223372036854775807})", true, 400, "got 9223372036854775807");
  for (const char* field : {"max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "n",
                            "presence_penalty", "frequency_penalty", "top_logprobs"}) {
    for (const char* number : {"1e309", "-1e309"}) {
      expect_bad("{" + m + ", \"" + field + "\": " + number + "}", true, 400,
                 "number overflow parsing '" + std::string(number) + "'");
    }
    try {
      serve::parse_completion_request("{" + m + ", \"" + field + "\": 1e300, \"logprobs\": true}", true);
      ADD_FAILURE() << field << " 1e300 accepted";
    } catch (const serve::ApiError& e) {
      EXPECT_EQ(e.status, 400) << field;
      EXPECT_EQ(e.param, field) << e.what();
    }
  }
  expect_bad("{" + m + R"(, "logit_bias": {"1": 1e309}})", true, 400, "number overflow");
  expect_bad(R"({"model": "m", "prompt": "x", "logprobs": 9223372036854775808})", false, 400,
             "got 9223372036854775808");
}

TEST(ServeApi, RoutesAnswer404ForUnknownPathsAnd405ForOtherMethods) {
  EXPECT_EQ(serve::route_of("POST", "/v1/chat/completions"), serve::Route::ChatCompletions);
  EXPECT_EQ(serve::route_of("POST", "/v1/completions"), serve::Route::Completions);
  EXPECT_EQ(serve::route_of("GET", "/v1/models"), serve::Route::Models);
  EXPECT_EQ(serve::route_of("GET", "/health"), serve::Route::Health);
  EXPECT_EQ(serve::route_of("GET", "/stats"), serve::Route::Stats);
  const auto status_of = [](const char* method, const char* path) {
    try {
      serve::route_of(method, path);
    } catch (const serve::ApiError& e) {
      return std::make_pair(e.status, std::string(e.what()));
    }
    return std::make_pair(200, std::string());
  };
  EXPECT_EQ(status_of("GET", "/v1/chat/completions"),
            std::make_pair(405, std::string("GET /v1/chat/completions is not allowed: use POST")));
  EXPECT_EQ(status_of("DELETE", "/v1/models").first, 405);
  EXPECT_EQ(status_of("POST", "/v1/nothing"), std::make_pair(404, std::string("no route POST /v1/nothing")));
  EXPECT_EQ(status_of("PRI", "*").first, 404);
}

TEST(ServeApi, ResponsesAndChunksAreOpenAIsFormat) {
  auto r = parse(
      {{"model", "m"}, {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}, {"return_token_ids", true}});
  const auto whole = json::parse(serve::completion_json(r, "chatcmpl-1", 100, "m", "Hello", "stop", {5, 2}, {7, 8}));
  EXPECT_EQ(whole["object"], "chat.completion");
  EXPECT_EQ(whole["choices"][0]["message"]["content"], "Hello");
  EXPECT_EQ(whole["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(whole["choices"][0]["token_ids"], json::array({7, 8}));
  EXPECT_EQ(whole["usage"]["total_tokens"], 7);
  r.stream = true;
  r.include_usage = true;
  const std::string first = serve::chunk_event(r, "chatcmpl-1", 100, "m", "", "", true, {});
  ASSERT_EQ(first.rfind("data: ", 0), 0u);
  ASSERT_EQ(first.substr(first.size() - 2), "\n\n");
  const auto chunk = json::parse(first.substr(6));
  EXPECT_EQ(chunk["object"], "chat.completion.chunk");
  EXPECT_EQ(chunk["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(chunk["usage"].is_null());
  const auto last = json::parse(serve::chunk_event(r, "chatcmpl-1", 100, "m", "", "length", false, {}).substr(6));
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(last["choices"][0]["delta"], json::object());
  const auto usage = json::parse(serve::usage_event(r, "chatcmpl-1", 100, "m", {3, 4}).substr(6));
  EXPECT_EQ(usage["choices"], json::array());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 4);
  auto c = parse({{"model", "m"}, {"prompt", "x"}}, false);
  EXPECT_EQ(json::parse(serve::completion_json(c, "cmpl-1", 1, "m", "t", "length", {1, 1}, {}))["choices"][0]["text"],
            "t");
  const auto err = json::parse(
      serve::error_json(serve::ApiError(503, "unavailable_error", "busy", "", "server_overloaded")));
  EXPECT_EQ(err["error"]["code"], "server_overloaded");
  EXPECT_TRUE(err["error"]["param"].is_null());
  const auto models = json::parse(serve::models_json("m", 5, 4096));
  EXPECT_EQ(models["object"], "list");
  EXPECT_EQ(models["data"][0]["id"], "m");
}

// logprobs as OpenAI's clients read them: chat's content list with bytes and
// top_logprobs; completions' tokens, token_logprobs, top_logprobs and text_offset.
TEST(ServeApi, LogprobsAreOpenAIsFormat) {
  const std::vector<serve::LogprobEntry> entries{{{"He", -0.25}, {{"He", -0.25}, {"Hi", -1.5}}, 0},
                                                 {{"\xc3", -0.5}, {{"\xc3", -0.5}, {"x", -2.0}}, 2}};
  auto chat = parse({{"model", "m"},
                     {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})},
                     {"logprobs", true},
                     {"top_logprobs", 2}});
  const auto whole = json::parse(serve::completion_json(chat, "c", 1, "m", "He\xc3", "stop", {1, 2}, {}, entries));
  const json content = whole["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["token"], "He");
  EXPECT_EQ(content[0]["logprob"], -0.25);
  EXPECT_EQ(content[0]["bytes"], json::array({72, 101}));
  EXPECT_EQ(content[0]["top_logprobs"][1]["token"], "Hi");
  EXPECT_EQ(content[0]["top_logprobs"][1]["logprob"], -1.5);
  EXPECT_EQ(content[1]["bytes"], json::array({195}));  // half a character: its byte, the text replaced
  EXPECT_EQ(content[1]["token"], "\xef\xbf\xbd");
  EXPECT_TRUE(whole["choices"][0]["logprobs"]["refusal"].is_null());
  const auto chunk = json::parse(serve::chunk_event(chat, "c", 1, "m", "He", "", false, {}, {entries[0]}).substr(6));
  EXPECT_EQ(chunk["choices"][0]["logprobs"]["content"].size(), 1u);
  EXPECT_TRUE(
      json::parse(serve::chunk_event(chat, "c", 1, "m", "", "stop", false, {}).substr(6))["choices"][0]["logprobs"]
          .is_null());
  auto text = parse({{"model", "m"}, {"prompt", "x"}, {"logprobs", 2}}, false);
  const auto t = json::parse(serve::completion_json(text, "c", 1, "m", "He\xc3", "stop", {1, 2}, {}, entries));
  const json lp = t["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"][0], "He");
  EXPECT_EQ(lp["token_logprobs"], json::array({-0.25, -0.5}));
  EXPECT_EQ(lp["top_logprobs"][0], json({{"He", -0.25}, {"Hi", -1.5}}));
  EXPECT_EQ(lp["text_offset"], json::array({0, 2}));
  // logprobs 0: each top_logprobs dict holds the chosen token (OpenAI's "up to logprobs + 1").
  text.logprobs = 0;
  const std::vector<serve::LogprobEntry> bare{{{"He", -0.25}, {}, 0}, {{"\xc3", -0.5}, {{"\xa9", -0.7}}, 2}};
  const json tops = json::parse(serve::completion_json(text, "c", 1, "m", "He", "stop", {1, 2}, {},
                                                       bare))["choices"][0]["logprobs"]["top_logprobs"];
  EXPECT_EQ(tops[0], json({{"He", -0.25}}));
  // Two half characters print alike: one key, the first's logprob.
  EXPECT_EQ(tops[1], json({{"\xef\xbf\xbd", -0.7}}));
  auto none = parse({{"model", "m"}, {"prompt", "x"}}, false);
  EXPECT_TRUE(json::parse(serve::completion_json(none, "c", 1, "m", "He", "stop", {1, 2}, {},
                                                 entries))["choices"][0]["logprobs"]
                  .is_null());
}

// A byte-level BPE whose tokens are pieces of text: 0 "a", 1 "b", 2 "c", 3 " ", 4 "ST",
// 5 "OP", 6 and 7 the two bytes of "é", 8 an end-of-text token.
torchattn::models::Tokenizer tiny_tokenizer() {
  const json t = {{"model",
                   {{"type", "BPE"},
                    {"vocab",
                     {{"a", 0}, {"b", 1}, {"c", 2}, {"\u0120", 3}, {"ST", 4}, {"OP", 5}, {"\u00c3", 6}, {"\u00a9", 7}}},
                    {"merges", json::array()}}},
                  {"pre_tokenizer", {{"type", "ByteLevel"}, {"use_regex", true}}},
                  {"decoder", {{"type", "ByteLevel"}}},
                  {"normalizer", nullptr},
                  {"post_processor", nullptr},
                  {"added_tokens", json::array({{{"id", 8}, {"content", "<end>"}, {"special", true}}})}};
  return torchattn::models::Tokenizer::from_json(t.dump(), "tiny");
}

std::vector<std::string> pieces(serve::TextStream& s, const std::vector<int64_t>& tokens) {
  std::vector<std::string> out;
  for (const int64_t t : tokens) out.push_back(s.push(t));
  out.push_back(s.finish());
  return out;
}

TEST(ServeText, WholeCharactersHiddenTokensAndStopSequences) {
  const auto tok = tiny_tokenizer();
  {
    serve::TextStream s(tok, {8}, {});
    EXPECT_EQ(pieces(s, {0, 6, 7, 3, 8, 1}), (std::vector<std::string>{"a", "", "\u00e9", " ", "", "b", ""}));
    EXPECT_EQ(s.text(), "a\u00e9 b");
    EXPECT_FALSE(s.stopped());
  }
  {
    serve::TextStream s(tok, {8}, {"STOP"});  // held while it may begin STOP, then the text ends before it
    EXPECT_EQ(pieces(s, {0, 4, 5, 1}), (std::vector<std::string>{"a", "", "", "", ""}));
    EXPECT_TRUE(s.stopped());
    EXPECT_EQ(s.text(), "a");
  }
  {
    serve::TextStream s(tok, {8}, {"bx", "zz"});  // "b" held, then shown when "c" rules "bx" out
    EXPECT_EQ(pieces(s, {0, 1, 2, 1}), (std::vector<std::string>{"a", "", "bc", "", "b"}));
    EXPECT_EQ(s.text(), "abcb");
    EXPECT_FALSE(s.stopped());
  }
  {
    serve::TextStream s(tok, {}, {"\u00e9 "});  // a stop sequence across a split character
    EXPECT_EQ(pieces(s, {2, 6, 7, 3, 0}), (std::vector<std::string>{"c", "", "", "", "", ""}));
    EXPECT_EQ(s.text(), "c");
    EXPECT_TRUE(s.stopped());
  }
}

}  // namespace

// libFuzzer target: torchattn_serve's request parsing (apps/serve/openai_api.cpp) on
// arbitrary bytes, as a client could send them. The input is "METHOD PATH\n" then the
// body: the route is looked up, and a completion route's body is parsed and checked,
// then rendered back (a response, a stream chunk, with logprobs) as the server would.
// Every outcome must be a request or an ApiError with a 4xx status: any other
// exception, or a 5xx, aborts.
//
// Seeds: tests/fuzz/serve_seeds.py writes the requests the official openai client sends.

#include "openai_api.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

namespace {

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz_serve_request: %s\n", what.c_str());
  std::abort();
}

void render(const serve::CompletionRequest& r) {
  serve::LogprobEntry entry{{"tok\xff", -0.5}, {{"a", -0.1}, {"a", -0.2}}, 3};
  const std::vector<serve::LogprobEntry> logprobs{entry};
  const std::string whole = serve::completion_json(r, "id", 1, r.model, "text", "stop", {1, 2}, {1, 2}, logprobs);
  const std::string chunk = serve::chunk_event(r, "id", 1, r.model, "t", "", true, {1}, logprobs);
  if (whole.empty() || chunk.empty()) fail("an empty response");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t line_end = input.find('\n');
  const std::string line = input.substr(0, line_end);
  const std::string body = line_end == std::string::npos ? std::string() : input.substr(line_end + 1);
  const size_t space = line.find(' ');
  const std::string method = line.substr(0, space);
  const std::string path = space == std::string::npos ? std::string() : line.substr(space + 1);
  try {
    const serve::Route route = serve::route_of(method, path);
    if (route == serve::Route::ChatCompletions || route == serve::Route::Completions) {
      const serve::CompletionRequest r = serve::parse_completion_request(body, route == serve::Route::ChatCompletions);
      if (r.chat ? r.messages.empty() : r.prompt.empty()) fail("a request without a prompt was accepted");
      if (r.max_tokens && *r.max_tokens < 1) fail("max_tokens < 1 was accepted");
      render(r);
    }
  } catch (const serve::ApiError& e) {
    if (e.status < 400 || e.status >= 500) fail("status " + std::to_string(e.status) + ": " + e.what());
    if (serve::error_json(e).empty()) fail("an empty error body");
  } catch (const std::exception& e) {
    fail(std::string("an exception that is not an ApiError: ") + e.what());
  }
  return 0;
}

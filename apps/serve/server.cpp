#include "server.h"

#include "channel.h"
#include "completion_run.h"
#include "front_door.h"
#include "openai_api.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/string.hpp>
#include <nlohmann/json.hpp>

#include <c10/util/Exception.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <tuple>
#include <utility>

namespace serve {

namespace models = torchattn::models;
using Clock = std::chrono::steady_clock;

namespace {

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string random_id(const char* prefix) {
  static const char alphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += alphabet[rng() % (sizeof(alphabet) - 1)];
  return id;
}

Reply error_reply(const ApiError& e) { return Reply{e.status, "application/json", error_json(e)}; }

// `s` without the spaces and tabs around it.
std::string_view trimmed(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool is_completion_path(std::string_view path) { return path == "/v1/chat/completions" || path == "/v1/completions"; }

// The target's path: what comes before a query.
std::string path_of(const Request& req) {
  const std::string_view target = req.target();
  return std::string(target.substr(0, target.find('?')));
}

ApiError too_large(size_t limit) {
  return ApiError(413, "invalid_request_error", "the request body is larger than " + std::to_string(limit) + " bytes",
                  "", "request_too_large");
}

// The error of a request the engine ended with an error (its model's logits were not
// finite): the server's fault, not the request's, and the server serves on.
ApiError model_error(const CompletionRun& run) {
  return ApiError(500, "server_error", run.error(), "", "non_finite_logits");
}

// The error of a request whose channel was aborted: 503 at shutdown, else 500 (the engine failed).
ApiError abort_error(const Channel& channel) {
  const int status = channel.abort_status();
  return ApiError(status, status == 503 ? "unavailable_error" : "server_error", channel.abort_message());
}

// "ADDR:PORT METHOD PATH": how a log line names a request ("-" for what is unknown).
std::string request_name(const std::string& remote, const Request& req) {
  const std::string method(req.method_string());
  return remote + " " + (method.empty() ? "-" : method) + " " + (req.target().empty() ? "-" : path_of(req));
}

// A completion request's log line: the request, its status, and once submitted its
// tokens and finish reason ("disconnected" unless `finished`), then the time it took.
std::string completion_line(const std::string& request, int status, bool stream, Clock::time_point start,
                            const CompletionRun* run = nullptr, bool finished = false) {
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  std::string line = request + " " + std::to_string(status) + (stream ? " stream" : "");
  if (run != nullptr) {
    line += " prompt=" + std::to_string(run->usage().prompt_tokens) +
            " completion=" + std::to_string(run->usage().completion_tokens) +
            " finish=" + (finished ? run->finish_reason() : std::string("disconnected"));
  }
  char took[32];
  std::snprintf(took, sizeof(took), " %.0f ms", ms);
  return line + took;
}

// A completion request the engine took: what its answer is made of.
struct Submitted {
  CompletionRequest request;
  int64_t id = 0;                      // the engine's
  std::shared_ptr<Channel> channel;    // the engine's events
  std::shared_ptr<CompletionRun> run;  // what the client sees of them
  std::string completion_id;
  int64_t created = 0;
};

}  // namespace


struct Server::Impl final : Service {
  Impl(models::LanguageModel& m, models::Engine& e, ServerOptions o)
      : model(m), engine(e), options(std::move(o)), door(*this, door_options(options)) {}

  static DoorOptions door_options(const ServerOptions& o) {
    DoorOptions d;
    d.max_body_bytes = o.max_body_bytes();
    d.max_connections = o.max_connections();
    d.header_timeout = std::chrono::seconds(o.timeout_seconds());
    d.body_timeout = d.idle_timeout = d.write_timeout = 3 * d.header_timeout;
    return d;
  }

  models::LanguageModel& model;
  models::Engine& engine;
  ServerOptions options;
  FrontDoor door;
  // Reads and tokenizes prompts, off the door's thread.
  net::thread_pool workers{1};
  int64_t created = unix_time();
  std::atomic<bool> stopping{false};
  std::atomic<bool> failed{false};
  std::string failure;
  std::thread listener;
  std::atomic<bool> stop_stepping{false};
  std::atomic<int64_t> served{0};
  // The requests in flight: engine id -> their channel (to end them at shutdown).
  std::mutex mutex;
  std::map<int64_t, std::shared_ptr<Channel>> active;

  void log(const std::string& line) {
    if (options.log()) std::fprintf(stderr, "torchattn_serve: %s\n", line.c_str());
  }

  void unregister(int64_t id) {
    std::lock_guard<std::mutex> lock(mutex);
    active.erase(id);
  }

  void end_all(int status, const std::string& message) {
    std::lock_guard<std::mutex> lock(mutex);
    for (auto& [id, channel] : active) {
      engine.cancel(id);
      channel->abort(status, message);
    }
  }

  void step_loop() {
    while (!stop_stepping) {
      engine.wait_for_work(std::chrono::milliseconds(100));
      try {
        engine.step();
      } catch (const std::exception& e) {
        failure = std::string("the engine failed: ") + e.what();
        failed = true;
        log(failure);
        end_all(500, failure);
        return;
      }
    }
  }

  // Service: what the door asks.
  std::optional<Reply> early(const Request& head) override;
  bool light(const Request& head) const override {
    const std::string path = path_of(head);
    return (head.method() == http::verb::get || head.method() == http::verb::head) &&
           (path == "/health" || path == "/stats");
  }
  net::awaitable<void> serve(Exchange& exchange) override;
  Reply refusal(int status, const std::string& message, const std::string& code) const override {
    const char* type = status == 503 ? "unavailable_error" : status >= 500 ? "server_error" : "invalid_request_error";
    return error_reply(ApiError(status, type, message, "", code));
  }
  void internal_error(const Request& request, const std::string& what) override {
    log("internal error on " + request_name("", request).substr(1) + ": " + what);
  }
  void answered(const std::string& remote, const Request& request, int status, bool closed) override {
    const std::string path = path_of(request);
    if (!is_completion_path(path) || status == 401 || status == 404 || status == 405 || status == 413 || closed) {
      log(request_name(remote, request) + " " + std::to_string(status) + (closed ? " (connection closed)" : ""));
    }
  }

  Reply health() const;
  Reply stats();

  // POST /v1/chat/completions and /v1/completions, in steps: accept, submit, then
  // answer_whole or answer_stream.
  net::awaitable<void> completions(Exchange& exchange, bool chat);
  // The server serves, `body` is a request for this model, and the engine can be asked
  // for it: the request and what the engine is asked for. Throws ApiError.
  std::pair<CompletionRequest, EngineRequest> accept(const std::string& body, bool chat) const;
  // Queues `request` on the engine, its events to `channel`: its id. Throws ApiError
  // (503 when the queue is full, 400 when the engine refuses it).
  int64_t submit(const EngineRequest& request, const std::shared_ptr<Channel>& channel);
  // Waits for the whole answer and writes it as one JSON body.
  net::awaitable<void> answer_whole(Exchange& exchange, const std::string& who, const Submitted& s,
                                    Clock::time_point start);
  // Streams the answer as server-sent events; the log line once the stream ends.
  net::awaitable<void> answer_stream(Exchange& exchange, const std::string& who, const Submitted& s,
                                     Clock::time_point start);
  // The events of a stream until its end; false when the client left.
  net::awaitable<bool> stream_events(Exchange& exchange, const Submitted& s);
};

net::awaitable<void> Server::Impl::serve(Exchange& exchange) {
  const Request& req = exchange.request();
  // HEAD as GET (the door writes its head only).
  const std::string method = req.method() == http::verb::head ? "GET" : std::string(req.method_string());
  Route route{};
  std::optional<ApiError> error;
  try {
    route = route_of(method, path_of(req));
  } catch (const ApiError& e) {
    error = e;
  }
  // Each co_await below takes named values, never temporaries: GCC 12 may destroy a
  // temporary of a co_await's full expression twice.
  Reply reply;
  if (error) {
    reply = error_reply(*error);
    co_await exchange.reply(reply);
    co_return;
  }
  switch (route) {
    case Route::ChatCompletions:
    case Route::Completions:
      co_await completions(exchange, route == Route::ChatCompletions);
      break;
    case Route::Models:
      reply = Reply{200, "application/json",
                    models_json(options.model_name(), created, model.model()->context_length())};
      co_await exchange.reply(reply);
      break;
    case Route::Health:
      reply = health();
      co_await exchange.reply(reply);
      break;
    case Route::Stats:
      reply = stats();
      co_await exchange.reply(reply);
      break;
  }
}

Reply Server::Impl::health() const {
  if (failed) return Reply{500, "application/json", nlohmann::json{{"status", "error"}, {"error", failure}}.dump()};
  if (stopping) return Reply{503, "application/json", R"({"status": "shutting down"})"};
  return Reply{200, "application/json", R"({"status": "ok"})"};
}

Reply Server::Impl::stats() {
  const auto s = engine.stats();
  int64_t in_flight = 0;
  {
    std::lock_guard<std::mutex> lock(mutex);
    in_flight = static_cast<int64_t>(active.size());
  }
  return Reply{200, "application/json",
               nlohmann::json{{"requests_in_flight", in_flight},
                              {"requests_served", served.load()},
                              {"running", s.running},
                              {"waiting", s.waiting},
                              {"kv_blocks", s.kv_blocks},
                              {"kv_blocks_used", s.kv_blocks_used},
                              {"kv_bytes_used", s.kv_bytes_used},
                              {"kv_block_size", engine.cache().block_size()},
                              {"tokens_held", s.tokens_held},
                              {"steps", s.steps},
                              {"finished", s.finished},
                              {"preempted", s.preempted},
                              {"kv_blocks_reusable", s.kv_blocks_reusable},
                              {"prefix_reused_tokens", s.prefix_reused_tokens}}
                   .dump()};
}

net::awaitable<void> Server::Impl::completions(Exchange& exchange, bool chat) {
  const auto start = Clock::now();
  const std::string who = request_name(exchange.remote(), exchange.request());
  Submitted s;
  s.channel = std::make_shared<Channel>();
  net::steady_timer timer(co_await net::this_coro::executor);
  const Channel::Waiting waiting(*s.channel, timer);
  EngineRequest engine_request;
  std::optional<ApiError> error;
  try {
    // The body parsed and the prompt tokenized on a worker: the door's thread serves on.
    const auto on_worker = [this, &body = exchange.request().body(),
                            chat]() -> net::awaitable<std::pair<CompletionRequest, EngineRequest>> {
      co_return accept(body, chat);
    };
    auto accepted = co_await net::co_spawn(workers, on_worker, net::use_awaitable);
    s.request = std::move(accepted.first);
    engine_request = std::move(accepted.second);
    s.id = submit(engine_request, s.channel);
  } catch (const ApiError& e) {
    error = e;
  }
  if (error) {
    const Reply reply = error_reply(*error);
    co_await exchange.reply(reply);
    log(completion_line(who, error->status, false, start));
    co_return;
  }
  // However the answer ends (written, the client gone, an exception): the engine's
  // request ended (ignored when it finished) and forgotten.
  struct Release {
    Impl& impl;
    int64_t id;
    ~Release() {
      impl.engine.cancel(id);
      impl.unregister(id);
    }
  } release{*this, s.id};
  ++served;
  s.run = std::make_shared<CompletionRun>(s.request, model, engine_request.prompt);
  s.completion_id = random_id(chat ? "chatcmpl-" : "cmpl-");
  s.created = unix_time();
  if (s.request.stream) {
    co_await answer_stream(exchange, who, s, start);
  } else {
    co_await answer_whole(exchange, who, s, start);
  }
}

std::pair<CompletionRequest, EngineRequest> Server::Impl::accept(const std::string& body, bool chat) const {
  if (stopping) throw ApiError(503, "unavailable_error", "the server is shutting down", "", "server_shutting_down");
  if (failed) throw ApiError(500, "server_error", failure);
  CompletionRequest request = parse_completion_request(body, chat);
  if (request.model != options.model_name()) {
    throw ApiError(404, "invalid_request_error",
                   "The model '" + request.model + "' does not exist; this server serves '" + options.model_name() +
                       "'",
                   "model", "model_not_found");
  }
  try {
    EngineRequest engine_request = prepare(request, model);
    return {std::move(request), std::move(engine_request)};
  } catch (const c10::Error& e) {
    throw bad_request(e.what_without_backtrace());  // what the request asked for cannot be made
  }
}

int64_t Server::Impl::submit(const EngineRequest& request, const std::shared_ptr<Channel>& channel) {
  try {
    std::lock_guard<std::mutex> lock(mutex);  // registered before its first event can come
    const int64_t id = engine.submit(request.prompt, request.options,
                                     [channel](const models::TokenEvent& e) { channel->push(e); });
    active[id] = channel;
    return id;
  } catch (const models::EngineFull& e) {
    throw ApiError(503, "unavailable_error", std::string("the server is overloaded: ") + e.what(), "",
                   "server_overloaded");
  } catch (const c10::Error& e) {
    throw bad_request(e.what_without_backtrace());
  }
}

net::awaitable<void> Server::Impl::answer_whole(Exchange& exchange, const std::string& who, const Submitted& s,
                                                Clock::time_point start) {
  CompletionRun& run = *s.run;
  models::TokenEvent event;
  while (!run.done()) {
    const auto got = co_await s.channel->pop(event, std::chrono::milliseconds(500));
    if (got == Channel::Pop::Aborted) {
      const ApiError e = abort_error(*s.channel);
      const Reply reply = error_reply(e);
      co_await exchange.reply(reply);
      log(completion_line(who, e.status, false, start, &run, run.done()));
      co_return;
    }
    if (got == Channel::Pop::Event) run.apply(event);
  }
  if (run.finish_reason() == "error") {
    const ApiError e = model_error(run);
    const Reply reply = error_reply(e);
    co_await exchange.reply(reply);
    log(completion_line(who, e.status, false, start, &run, true) + ": " + run.error());
    co_return;
  }
  const Reply reply{200, "application/json",
                    completion_json(s.request, s.completion_id, s.created, options.model_name(), run.text(),
                                    run.finish_reason(), run.usage(), run.ids(), run.logprobs())};
  co_await exchange.reply(reply);
  log(completion_line(who, 200, false, start, &run, run.done()));
}

net::awaitable<void> Server::Impl::answer_stream(Exchange& exchange, const std::string& who, const Submitted& s,
                                                 Clock::time_point start) {
  const std::vector<std::pair<std::string, std::string>> headers{{"Cache-Control", "no-cache"}};
  bool ok = co_await exchange.begin_stream("text/event-stream", headers);
  if (ok) ok = co_await stream_events(exchange, s);
  log(completion_line(who, 200, true, start, s.run.get(), s.run->done() && ok));
}

net::awaitable<bool> Server::Impl::stream_events(Exchange& exchange, const Submitted& s) {
  const CompletionRequest& request = s.request;
  CompletionRun& run = *s.run;
  const std::string& name = options.model_name();
  std::string event_text;  // each event named before it is sent (see serve())
  if (request.chat) {
    event_text = chunk_event(request, s.completion_id, s.created, name, "", "", true, {});
    if (!co_await exchange.send(event_text)) co_return false;
  }
  models::TokenEvent event;
  auto quiet_since = Clock::now();
  while (!run.done()) {
    const auto got = co_await s.channel->pop(event, std::chrono::milliseconds(500));
    if (got == Channel::Pop::Aborted) {
      event_text = error_event(abort_error(*s.channel));
      co_await exchange.send(event_text);
      co_await exchange.send("data: [DONE]\n\n");
      co_await exchange.end_stream();
      co_return true;
    }
    if (got == Channel::Pop::Timeout) {
      // A comment every few seconds while nothing comes (a long prompt): a client
      // that left is noticed by the failed write.
      if (Clock::now() - quiet_since > std::chrono::seconds(2)) {
        if (!co_await exchange.send(": waiting\n\n")) co_return false;
        quiet_since = Clock::now();
      }
      continue;
    }
    quiet_since = Clock::now();
    const Delta delta = run.apply(event);
    if (run.finish_reason() == "error") {  // the stream ends with the error, as at shutdown
      event_text = error_event(model_error(run));
      bool ok = co_await exchange.send(event_text);
      if (ok) ok = co_await exchange.send("data: [DONE]\n\n");
      if (ok) ok = co_await exchange.end_stream();
      log(request_name(exchange.remote(), exchange.request()) + ": " + run.error());
      co_return ok;
    }
    if (run.cancel_engine()) engine.cancel(s.id);
    const bool show = !delta.text.empty() || !delta.logprobs.empty() ||
                      (request.return_token_ids && !delta.ids.empty());
    if (show) {
      event_text = chunk_event(request, s.completion_id, s.created, name, delta.text, "", false, delta.ids,
                               delta.logprobs);
      if (!co_await exchange.send(event_text)) co_return false;
    }
  }
  event_text = chunk_event(request, s.completion_id, s.created, name, "", run.finish_reason(), false, {});
  bool ok = co_await exchange.send(event_text);
  if (ok && request.include_usage) {
    event_text = usage_event(request, s.completion_id, s.created, name, run.usage());
    ok = co_await exchange.send(event_text);
  }
  if (ok) ok = co_await exchange.send("data: [DONE]\n\n");
  if (ok) ok = co_await exchange.end_stream();
  co_return ok;
}

std::optional<Reply> Server::Impl::early(const Request& head) {
  const std::string method(head.method_string());
  const std::string path = path_of(head);
  const auto error = [](const ApiError& e) { return std::optional<Reply>(error_reply(e)); };
  const bool get = head.method() == http::verb::get || head.method() == http::verb::head;
  const bool post = head.method() == http::verb::post;
  if (!get && !post) {
    try {
      route_of(method, path);
    } catch (const ApiError& e) {
      return error(e);
    }
    return error(ApiError(405, "invalid_request_error", method + " is not allowed"));
  }
  if (!post && may_have_body(head)) return error(bad_request(method + " " + path + " takes no request body"));
  if (!options.api_key().empty() && path != "/health" &&
      head[http::field::authorization] != "Bearer " + options.api_key()) {
    return error(ApiError(401, "authentication_error",
                          "Invalid or missing API key: send the header 'Authorization: Bearer <key>'", "",
                          "invalid_api_key"));
  }
  if (post) {
    try {
      route_of(method, path);
    } catch (const ApiError& e) {
      return error(e);
    }
    // The body's encodings: plain bytes, chunked or not; nothing decompresses here.
    const auto transfer = head.find(http::field::transfer_encoding);
    if (transfer != head.end() && !boost::beast::iequals(trimmed(transfer->value()), "chunked")) {
      return error(ApiError(415, "invalid_request_error",
                            "Transfer-Encoding '" + std::string(trimmed(transfer->value()).substr(0, 100)) +
                                "' is not supported: send the body as it is, with Content-Length or "
                                "Transfer-Encoding: chunked",
                            "", "unsupported_encoding"));
    }
    const auto content_encoding = trimmed(head[http::field::content_encoding]);
    if (!content_encoding.empty() && !boost::beast::iequals(content_encoding, "identity")) {
      return error(ApiError(415, "invalid_request_error",
                            "Content-Encoding '" + std::string(content_encoding.substr(0, 100)) +
                                "' is not supported: send the JSON body uncompressed",
                            "", "unsupported_encoding"));
    }
    const auto length = head.find(http::field::content_length);
    if (transfer == head.end() && length == head.end()) {
      return error(ApiError(411, "invalid_request_error",
                            "POST " + path +
                                " takes a JSON body: send it with a Content-Length header (or "
                                "Transfer-Encoding: chunked); the request had neither",
                            "", "length_required"));
    }
    // The door's parser has checked that a Content-Length is a number (one past 64 bits
    // it refuses as too large).
    if (length != head.end()) {
      const std::string_view digits = length->value();
      uint64_t bytes = 0;
      const auto [end, failed] = std::from_chars(digits.data(), digits.data() + digits.size(), bytes);
      if (failed != std::errc() || bytes > options.max_body_bytes()) return error(too_large(options.max_body_bytes()));
    }
    const std::string_view type = head[http::field::content_type];
    if (type.starts_with("multipart/form-data")) {
      return error(ApiError(415, "invalid_request_error",
                            "the request body must be JSON (Content-Type: application/json), "
                            "got multipart/form-data"));
    }
  }
  return std::nullopt;
}

Server::Server(models::LanguageModel& model, models::Engine& engine, ServerOptions options)
    : impl_(std::make_unique<Impl>(model, engine, std::move(options))) {}

Server::~Server() {
  impl_->stop_stepping = true;
  impl_->engine.stop_waiting();
  if (impl_->listener.joinable()) impl_->listener.join();
  impl_->workers.join();
}

int Server::bind() { return impl_->door.bind(impl_->options.host(), impl_->options.port()); }

void Server::run() {
  impl_->listener = std::thread([this] {
    impl_->door.run();
    impl_->stop_stepping = true;
    impl_->engine.stop_waiting();
  });
  impl_->step_loop();  // returns once the door closes, or early when the engine fails
  impl_->listener.join();
}

void Server::shutdown() {
  impl_->stopping = true;
  impl_->end_all(503, "the server is shutting down");
  impl_->door.stop();
}

}  // namespace serve

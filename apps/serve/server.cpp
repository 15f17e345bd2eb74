#include "server.h"

#include "channel.h"
#include "completion_run.h"
#include "connection.h"
#include "openai_api.h"

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <c10/util/Exception.h>

#include <atomic>
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

void respond_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(error_json(e), "application/json");
}

bool is_completion_path(const std::string& path) { return path == "/v1/chat/completions" || path == "/v1/completions"; }

// Set by a handler that left the request's body unread (or half read): the logger,
// which runs on the connection's thread once the response is written, then ends the
// connection. `pre_routed`: the request reached the pre-routing handler (httplib's own
// errors, a request line or header it could not read, come before it).
thread_local bool close_after_response = false;
thread_local bool pre_routed = false;

// Whether a body may follow the headers (HTTP/1.1: a request with neither header has none).
bool may_have_body(const httplib::Request& req) {
  return req.has_header("Transfer-Encoding") ||
         (req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0");
}

// The error, and the end of the connection when a body may be left unread.
void respond_and_close(const httplib::Request& req, httplib::Response& res, const ApiError& e) {
  respond_error(res, e);
  if (may_have_body(req)) {
    res.set_header("Connection", "close");
    close_after_response = true;
  }
}

ApiError too_large(size_t limit) {
  return ApiError(413, "invalid_request_error", "the request body is larger than " + std::to_string(limit) + " bytes",
                  "", "request_too_large");
}

// A body, read through `reader`, at most `limit` bytes, counted as it comes whatever
// its transfer encoding (a Content-Length over the limit is refused before: see
// Impl::early_error). Throws ApiError 413 past the limit, 400 when it cannot be read;
// then the connection must close.
std::string read_body(const httplib::Request& req, const httplib::ContentReader& reader, size_t limit) {
  if (!may_have_body(req)) return {};
  std::string body;
  bool over = false;
  bool read = false;
  try {
    read = reader([&](const char* data, size_t n) {
      if (n > limit - body.size()) {
        over = true;
        return false;
      }
      body.append(data, n);
      return true;
    });
  } catch (const std::exception& e) {
    throw bad_request(std::string("the request body could not be read: ") + e.what());
  }
  if (over) throw too_large(limit);
  if (!read) throw bad_request("the request body could not be read (malformed chunked encoding, or the client left)");
  return body;
}

// Writes an SSE event; false when the client is gone.
bool send(httplib::DataSink& sink, const std::string& event) { return sink.write(event.data(), event.size()); }

// The error of a request whose channel was aborted: 503 at shutdown, else 500 (the engine failed).
ApiError abort_error(const Channel& channel) {
  const int status = channel.abort_status();
  return ApiError(status, status == 503 ? "unavailable_error" : "server_error", channel.abort_message());
}

// "ADDR METHOD PATH": how a log line names a request.
std::string request_name(const httplib::Request& req) { return req.remote_addr + " " + req.method + " " + req.path; }

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

struct Server::Impl {
  Impl(models::LanguageModel& m, models::Engine& e, ServerOptions o) : model(m), engine(e), options(std::move(o)) {}

  models::LanguageModel& model;
  models::Engine& engine;
  ServerOptions options;
  httplib::Server http;
  int64_t created = unix_time();
  std::atomic<bool> stopping{false};
  std::atomic<bool> failed{false};
  std::string failure;
  std::thread listener;
  std::atomic<bool> stop_stepping{false};
  // run()'s listening has ended (or will not start): shutdown() waits for no loop.
  std::atomic<bool> run_ended{false};
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

  // POST /v1/chat/completions and /v1/completions, in steps: accept, submit, then
  // answer_whole or answer_stream.
  void completions(const httplib::Request& req, httplib::Response& res, const std::string& body, bool chat);
  // The server serves, `body` is a request for this model, and the engine can be asked
  // for it: the request and what the engine is asked for. Throws ApiError.
  std::pair<CompletionRequest, EngineRequest> accept(const std::string& body, bool chat) const;
  // Queues `request` on the engine, its events to `channel`: its id. Throws ApiError
  // (503 when the queue is full, 400 when the engine refuses it).
  int64_t submit(const EngineRequest& request, const std::shared_ptr<Channel>& channel);
  // Waits for the whole answer and writes it as one JSON body.
  void answer_whole(const std::string& who, httplib::Response& res, const Submitted& s, Clock::time_point start);
  // Streams the answer as server-sent events; the log line once the stream ends.
  void answer_stream(const std::string& who, httplib::Response& res, const Submitted& s, Clock::time_point start);
  // The events of a stream until its end; false when the client left.
  bool stream_events(httplib::DataSink& sink, const Submitted& s);
  std::optional<ApiError> early_error(const httplib::Request& req) const;
  void routes();
};

void Server::Impl::completions(const httplib::Request& req, httplib::Response& res, const std::string& body,
                               bool chat) {
  const auto start = Clock::now();
  const std::string who = request_name(req);
  Submitted s;
  s.channel = std::make_shared<Channel>();
  EngineRequest engine_request;
  try {
    std::tie(s.request, engine_request) = accept(body, chat);
    s.id = submit(engine_request, s.channel);
  } catch (const ApiError& e) {
    respond_error(res, e);
    log(completion_line(who, e.status, false, start));
    return;
  }
  ++served;
  s.run = std::make_shared<CompletionRun>(s.request, model, static_cast<int64_t>(engine_request.prompt.size()));
  s.completion_id = random_id(chat ? "chatcmpl-" : "cmpl-");
  s.created = unix_time();
  if (s.request.stream) {
    answer_stream(who, res, s, start);
  } else {
    answer_whole(who, res, s, start);
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

void Server::Impl::answer_whole(const std::string& who, httplib::Response& res, const Submitted& s,
                                Clock::time_point start) {
  CompletionRun& run = *s.run;
  models::TokenEvent event;
  while (!run.done()) {
    const auto got = s.channel->pop(event, std::chrono::milliseconds(500));
    if (got == Channel::Pop::Aborted) {
      respond_error(res, abort_error(*s.channel));
      unregister(s.id);
      log(completion_line(who, res.status, false, start, &run, run.done()));
      return;
    }
    if (got == Channel::Pop::Event) run.apply(event);
  }
  if (run.cancel_engine()) engine.cancel(s.id);
  res.set_content(completion_json(s.request, s.completion_id, s.created, options.model_name(), run.text(),
                                  run.finish_reason(), run.usage(), run.ids(), run.logprobs()),
                  "application/json");
  unregister(s.id);
  log(completion_line(who, 200, false, start, &run, run.done()));
}

void Server::Impl::answer_stream(const std::string& who, httplib::Response& res, const Submitted& s,
                                 Clock::time_point start) {
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream", [this, s](size_t, httplib::DataSink& sink) { return stream_events(sink, s); },
      [this, who, run = s.run, id = s.id, start](bool success) {
        if (!run->done() || !success) engine.cancel(id);  // the client left: its blocks go back
        unregister(id);
        log(completion_line(who, 200, true, start, run.get(), run->done() && success));
      });
}

bool Server::Impl::stream_events(httplib::DataSink& sink, const Submitted& s) {
  const CompletionRequest& request = s.request;
  CompletionRun& run = *s.run;
  const std::string& name = options.model_name();
  if (request.chat && !send(sink, chunk_event(request, s.completion_id, s.created, name, "", "", true, {}))) {
    engine.cancel(s.id);
    return false;
  }
  models::TokenEvent event;
  auto quiet_since = Clock::now();
  while (!run.done()) {
    const auto got = s.channel->pop(event, std::chrono::milliseconds(500));
    if (got == Channel::Pop::Aborted) {
      send(sink, error_event(abort_error(*s.channel)));
      send(sink, "data: [DONE]\n\n");
      sink.done();
      return true;
    }
    if (got == Channel::Pop::Timeout) {
      // A comment every few seconds while nothing comes (a long prompt): a client
      // that left is noticed by the failed write.
      if (Clock::now() - quiet_since > std::chrono::seconds(2)) {
        if (!send(sink, ": waiting\n\n")) {
          engine.cancel(s.id);
          return false;
        }
        quiet_since = Clock::now();
      }
      continue;
    }
    quiet_since = Clock::now();
    const Delta delta = run.apply(event);
    if (run.cancel_engine()) engine.cancel(s.id);
    const bool show = !delta.text.empty() || !delta.logprobs.empty() ||
                      (request.return_token_ids && !delta.ids.empty());
    if (show && !send(sink, chunk_event(request, s.completion_id, s.created, name, delta.text, "", false, delta.ids,
                                        delta.logprobs))) {
      engine.cancel(s.id);
      return false;
    }
  }
  bool ok = send(sink, chunk_event(request, s.completion_id, s.created, name, "", run.finish_reason(), false, {}));
  if (ok && request.include_usage) ok = send(sink, usage_event(request, s.completion_id, s.created, name, run.usage()));
  ok = ok && send(sink, "data: [DONE]\n\n");
  if (!ok) return false;
  sink.done();
  return true;
}

std::optional<ApiError> Server::Impl::early_error(const httplib::Request& req) const {
  if (req.method != "GET" && req.method != "HEAD" && req.method != "POST") {
    try {
      route_of(req.method, req.path);
    } catch (const ApiError& e) {
      return e;
    }
    return ApiError(405, "invalid_request_error", req.method + " is not allowed");
  }
  if (req.method != "POST" && may_have_body(req)) {
    return bad_request(req.method + " " + req.path + " takes no request body");
  }
  if (!options.api_key().empty() && req.path != "/health" &&
      req.get_header_value("Authorization") != "Bearer " + options.api_key()) {
    return ApiError(401, "authentication_error",
                    "Invalid or missing API key: send the header 'Authorization: Bearer <key>'", "", "invalid_api_key");
  }
  if (req.method == "POST") {
    try {
      route_of(req.method, req.path);
    } catch (const ApiError& e) {
      return e;
    }
    if (req.has_header("Content-Length")) {
      const std::string length = req.get_header_value("Content-Length");
      if (length.empty() || length.size() > 19 || length.find_first_not_of("0123456789") != std::string::npos) {
        return bad_request("the Content-Length header is not a number: '" + length + "'");
      }
      if (std::stoull(length) > options.max_body_bytes()) return too_large(options.max_body_bytes());
    }
    if (req.is_multipart_form_data()) {
      return ApiError(415, "invalid_request_error",
                      "the request body must be JSON (Content-Type: application/json), "
                      "got multipart/form-data");
    }
  }
  return std::nullopt;
}

void Server::Impl::routes() {
  http.new_task_queue = [n = options.http_threads()] { return new httplib::ThreadPool(static_cast<size_t>(n)); };
  http.set_socket_options(exclusive_bind_options);
  http.set_payload_max_length(options.max_body_bytes());
  // Before any body is read (and before 100 Continue invites one): the requests that
  // can be answered from their headers alone, their connection ended.
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    close_after_response = false;
    pre_routed = true;
    if (const auto e = early_error(req)) {
      respond_and_close(req, res, *e);
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http.set_expect_100_continue_handler([this](const httplib::Request& req, httplib::Response& res) {
    close_after_response = false;
    pre_routed = true;
    if (const auto e = early_error(req)) {
      respond_and_close(req, res, *e);
      return e->status;
    }
    return 100;
  });
  // Every POST: its body read here, counted against the limit, then its route.
  http.Post(".*", [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
    std::string body;
    Route route{};
    try {
      route = route_of(req.method, req.path);
      body = read_body(req, reader, options.max_body_bytes());
    } catch (const ApiError& e) {
      respond_and_close(req, res, e);
      return;
    }
    completions(req, res, body, route == Route::ChatCompletions);
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(models_json(options.model_name(), created, model.model()->context_length()), "application/json");
  });
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (failed) {
      res.status = 500;
      res.set_content(nlohmann::json{{"status", "error"}, {"error", failure}}.dump(), "application/json");
    } else if (stopping) {
      res.status = 503;
      res.set_content(R"({"status": "shutting down"})", "application/json");
    } else {
      res.set_content(R"({"status": "ok"})", "application/json");
    }
  });
  http.Get("/stats", [this](const httplib::Request&, httplib::Response& res) {
    const auto s = engine.stats();
    int64_t in_flight = 0;
    {
      std::lock_guard<std::mutex> lock(mutex);
      in_flight = static_cast<int64_t>(active.size());
    }
    res.set_content(nlohmann::json{{"requests_in_flight", in_flight},
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
                        .dump(),
                    "application/json");
  });
  // Errors that no handler wrote a body for: an unknown route (404, 405), a request
  // httplib could not read (400, 414, ...).
  http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!pre_routed) close_after_response = true;  // httplib's own error: what follows is unknown
    if (!res.body.empty()) return;
    if (res.status == 404) {
      try {
        route_of(req.method, req.path);
        respond_error(res, ApiError(404, "not_found_error", "no route " + req.method + " " + req.path));
      } catch (const ApiError& e) {
        respond_error(res, e);
      }
    } else {
      respond_error(res, ApiError(res.status, "invalid_request_error", "the request could not be read"));
    }
  });
  http.set_exception_handler([this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {}
    log("internal error: " + what);
    respond_error(res, ApiError(500, "server_error", "internal error: " + what));
  });
  // Runs on the connection's thread once the response is written.
  http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    if (!is_completion_path(req.path) || res.status == 401 || res.status == 404 || res.status == 405 ||
        res.status == 413 || close_after_response) {
      log(req.remote_addr + " " + req.method + " " + req.path + " " + std::to_string(res.status) +
          (close_after_response ? " (connection closed)" : ""));
    }
    pre_routed = false;
    if (close_after_response) {
      close_after_response = false;
      if (!end_connection(req)) log("could not find the connection of " + req.remote_addr + " to close it");
    }
  });
}

Server::Server(models::LanguageModel& model, models::Engine& engine, ServerOptions options)
    : impl_(std::make_unique<Impl>(model, engine, std::move(options))) {
  impl_->routes();
}

Server::~Server() {
  impl_->stop_stepping = true;
  impl_->engine.stop_waiting();
  if (impl_->listener.joinable()) impl_->listener.join();
}

int Server::bind() {
  const auto& o = impl_->options;
  const int port = o.port() == 0 ? impl_->http.bind_to_any_port(o.host()) : o.port();
  if (port < 0 || (o.port() != 0 && !impl_->http.bind_to_port(o.host(), o.port()))) {
    throw std::runtime_error(why_not_listen(o.host(), o.port()));
  }
  return port;
}

void Server::run() {
  impl_->listener = std::thread([this] {
    impl_->http.listen_after_bind();
    impl_->run_ended = true;
    impl_->stop_stepping = true;
    impl_->engine.stop_waiting();
  });
  impl_->step_loop();  // returns once the listening ends, or early when the engine fails
  impl_->listener.join();
}

void Server::shutdown() {
  impl_->stopping = true;
  impl_->end_all(503, "the server is shutting down");
  // httplib's stop() does nothing before its listening loop runs: a signal right after
  // "listening" was printed waits for the loop (run() is on its way to it), at most 10 s.
  for (int i = 0; i < 10000 && !impl_->http.is_running() && !impl_->run_ended; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  impl_->http.stop();
}

}  // namespace serve

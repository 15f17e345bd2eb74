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
  std::thread stepper;
  std::atomic<bool> stop_stepping{false};
  std::atomic<int64_t> served{0};
  // The requests in flight: engine id -> their channel (to end them at shutdown).
  std::mutex mutex;
  std::map<int64_t, std::shared_ptr<Channel>> active;

  void log(const std::string& line) {
    if (options.log) std::fprintf(stderr, "torchattn_serve: %s\n", line.c_str());
  }

  // What a completion request's log line says.
  std::string completion_line(const httplib::Request& req, int status, bool stream, const CompletionRun* run,
                              Clock::time_point start) {
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    std::string line = req.remote_addr + " " + req.method + " " + req.path + " " + std::to_string(status) +
                       (stream ? " stream" : "");
    if (run != nullptr) {
      line += " prompt=" + std::to_string(run->usage().prompt_tokens) +
              " completion=" + std::to_string(run->usage().completion_tokens) +
              " finish=" + (run->done() ? run->finish_reason() : std::string("disconnected"));
    }
    char took[32];
    std::snprintf(took, sizeof(took), " %.0f ms", ms);
    return line + took;
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

  void completions(const httplib::Request& req, httplib::Response& res, const std::string& body, bool chat);
  std::optional<ApiError> early_error(const httplib::Request& req) const;
  void routes();
};

void Server::Impl::completions(const httplib::Request& req, httplib::Response& res, const std::string& body,
                               bool chat) {
  const auto start = Clock::now();
  CompletionRequest request;
  EngineRequest engine_request;
  try {
    if (stopping) throw ApiError(503, "unavailable_error", "the server is shutting down", "", "server_shutting_down");
    if (failed) throw ApiError(500, "server_error", failure);
    request = parse_completion_request(body, chat);
    if (request.model != options.model_name) {
      throw ApiError(404, "invalid_request_error",
                     "The model '" + request.model + "' does not exist; this server serves '" + options.model_name +
                         "'",
                     "model", "model_not_found");
    }
    try {
      engine_request = prepare(request, model);
    } catch (const c10::Error& e) {
      throw bad_request(e.what_without_backtrace());  // what the request asked for cannot be made
    }
  } catch (const ApiError& e) {
    respond_error(res, e);
    log(completion_line(req, e.status, false, nullptr, start));
    return;
  }
  auto channel = std::make_shared<Channel>();
  int64_t id = 0;
  try {
    std::lock_guard<std::mutex> lock(mutex);  // registered before its first event can come
    id = engine.submit(engine_request.prompt, engine_request.options,
                       [channel](const models::TokenEvent& e) { channel->push(e); });
    active[id] = channel;
  } catch (const models::EngineFull& e) {
    respond_error(res, ApiError(503, "unavailable_error", std::string("the server is overloaded: ") + e.what(), "",
                                "server_overloaded"));
    log(completion_line(req, 503, false, nullptr, start));
    return;
  } catch (const c10::Error& e) {
    respond_error(res, bad_request(e.what_without_backtrace()));
    log(completion_line(req, 400, false, nullptr, start));
    return;
  }
  ++served;
  auto run = std::make_shared<CompletionRun>(request, model, static_cast<int64_t>(engine_request.prompt.size()));
  const std::string completion_id = random_id(chat ? "chatcmpl-" : "cmpl-");
  const int64_t created = unix_time();
  const std::string& name = options.model_name;

  if (!request.stream) {
    models::TokenEvent event;
    while (!run->done()) {
      const auto got = channel->pop(event, std::chrono::milliseconds(500));
      if (got == Channel::Pop::Aborted) {
        respond_error(res, ApiError(channel->abort_status(),
                                    channel->abort_status() == 503 ? "unavailable_error" : "server_error",
                                    channel->abort_message()));
        unregister(id);
        log(completion_line(req, res.status, false, run.get(), start));
        return;
      }
      if (got == Channel::Pop::Event) run->apply(event);
    }
    if (run->cancel_engine()) engine.cancel(id);
    res.set_content(completion_json(request, completion_id, created, name, run->text(), run->finish_reason(),
                                    run->usage(), run->ids(), run->logprobs()),
                    "application/json");
    unregister(id);
    log(completion_line(req, 200, false, run.get(), start));
    return;
  }

  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, request, run, channel, id, completion_id, created, name](size_t, httplib::DataSink& sink) {
        if (request.chat && !send(sink, chunk_event(request, completion_id, created, name, "", "", true, {}))) {
          engine.cancel(id);
          return false;
        }
        models::TokenEvent event;
        auto quiet_since = Clock::now();
        while (!run->done()) {
          const auto got = channel->pop(event, std::chrono::milliseconds(500));
          if (got == Channel::Pop::Aborted) {
            const ApiError e(channel->abort_status(),
                             channel->abort_status() == 503 ? "unavailable_error" : "server_error",
                             channel->abort_message());
            send(sink, error_event(e));
            send(sink, "data: [DONE]\n\n");
            sink.done();
            return true;
          }
          if (got == Channel::Pop::Timeout) {
            // A comment every few seconds while nothing comes (a long prompt): a client
            // that left is noticed by the failed write.
            if (Clock::now() - quiet_since > std::chrono::seconds(2)) {
              if (!send(sink, ": waiting\n\n")) {
                engine.cancel(id);
                return false;
              }
              quiet_since = Clock::now();
            }
            continue;
          }
          quiet_since = Clock::now();
          const Delta delta = run->apply(event);
          if (run->cancel_engine()) engine.cancel(id);
          const bool show = !delta.text.empty() || !delta.logprobs.empty() ||
                            (request.return_token_ids && !delta.ids.empty());
          if (show && !send(sink, chunk_event(request, completion_id, created, name, delta.text, "", false, delta.ids,
                                              delta.logprobs))) {
            engine.cancel(id);
            return false;
          }
        }
        bool ok = send(sink, chunk_event(request, completion_id, created, name, "", run->finish_reason(), false, {}));
        if (ok && request.include_usage)
          ok = send(sink, usage_event(request, completion_id, created, name, run->usage()));
        ok = ok && send(sink, "data: [DONE]\n\n");
        if (!ok) return false;
        sink.done();
        return true;
      },
      [this, req_line = req.remote_addr + " " + req.method + " " + req.path, run, id, start](bool success) {
        if (!run->done() || !success) engine.cancel(id);  // the client left: its blocks go back
        unregister(id);
        const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
        char took[32];
        std::snprintf(took, sizeof(took), " %.0f ms", ms);
        log(req_line + " 200 stream prompt=" + std::to_string(run->usage().prompt_tokens) +
            " completion=" + std::to_string(run->usage().completion_tokens) +
            " finish=" + (run->done() && success ? run->finish_reason() : std::string("disconnected")) + took);
      });
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
  if (!options.api_key.empty() && req.path != "/health" &&
      req.get_header_value("Authorization") != "Bearer " + options.api_key) {
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
      if (std::stoull(length) > options.max_body_bytes) return too_large(options.max_body_bytes);
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
  http.new_task_queue = [n = options.http_threads] { return new httplib::ThreadPool(static_cast<size_t>(n)); };
  http.set_socket_options(exclusive_bind_options);
  http.set_payload_max_length(options.max_body_bytes);
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
      body = read_body(req, reader, options.max_body_bytes);
    } catch (const ApiError& e) {
      respond_and_close(req, res, e);
      return;
    }
    completions(req, res, body, route == Route::ChatCompletions);
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(models_json(options.model_name, created, model.model()->context_length()), "application/json");
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
  if (impl_->stepper.joinable()) impl_->stepper.join();
}

int Server::bind() {
  const auto& o = impl_->options;
  const int port = o.port == 0 ? impl_->http.bind_to_any_port(o.host) : o.port;
  if (port < 0 || (o.port != 0 && !impl_->http.bind_to_port(o.host, o.port))) {
    throw std::runtime_error(why_not_listen(o.host, o.port));
  }
  return port;
}

void Server::run() {
  impl_->stepper = std::thread([this] { impl_->step_loop(); });
  impl_->http.listen_after_bind();
  impl_->stop_stepping = true;
  impl_->engine.stop_waiting();
  impl_->stepper.join();
}

void Server::shutdown() {
  impl_->stopping = true;
  impl_->end_all(503, "the server is shutting down");
  impl_->http.stop();
}

}  // namespace serve

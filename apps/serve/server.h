#pragma once

// torchattn_serve's HTTP side: OpenAI's API (POST /v1/chat/completions and
// /v1/completions, streamed as server-sent events or not; GET /v1/models), GET /health
// and GET /stats, over a models::Engine that run()'s calling thread steps. The front
// door (front_door.h: Boost.Beast, every connection a coroutine on one thread of its
// own) bounds what each client may hold; a request's tokens come from the engine's
// thread through a channel of its own, and its prompt is read and tokenized on a
// worker thread, so that the door's thread never waits.

#include <torchattn/models/engine.h>
#include <torchattn/models/language_model.h>

#include <torch/arg.h>

#include <cstddef>
#include <memory>
#include <string>

namespace serve {

struct ServerOptions {
  TORCH_ARG(std::string, host) = "127.0.0.1";
  /// 0: a free port.
  TORCH_ARG(int, port) = 8080;
  /// Empty: none; else every route but /health wants "Authorization: Bearer KEY".
  TORCH_ARG(std::string, api_key) = "";
  /// The model's id in requests and /v1/models.
  TORCH_ARG(std::string, model_name) = "";
  /// Larger bodies get 413.
  TORCH_ARG(size_t, max_body_bytes) = 1 << 20;
  /// Connections held at once. Past it a new connection closes the oldest one that
  /// waits for a request; when each is busy, a few more are let in for /health and
  /// /stats, and other requests on them get 503.
  TORCH_ARG(int, max_connections) = 256;
  /// Seconds: a request's line and headers must come within it of their first byte,
  /// its body within 3 times it, and a connection idle between requests is closed
  /// after 3 times it.
  TORCH_ARG(int, timeout_seconds) = 10;
  /// A line per request on stderr.
  TORCH_ARG(bool, log) = true;
};

class Server {
 public:
  /// `model` gives the tokenizer, the chat template and the context length; `engine`
  /// runs its CausalLM.
  Server(torchattn::models::LanguageModel& model, torchattn::models::Engine& engine, ServerOptions options);
  ~Server();

  /// Binds the socket; returns the port (a free one when options.port is 0). Throws
  /// std::runtime_error naming the address when it cannot.
  int bind();

  /// Serves until shutdown(), stepping the engine on the calling thread (listening on
  /// another). Call it from the thread that loaded the model: OpenMP keeps a pool of
  /// worker threads for each thread that starts parallel regions, and once the pools
  /// hold more threads than there are CPUs, libgomp's workers sleep right after each
  /// region instead of spinning for the next, so each of a step's hundreds of regions
  /// would wait for a worker to wake (docs/serving.md).
  void run();

  /// From any thread (a signal watcher): new requests get 503, running ones are
  /// cancelled (a stream ends with an error event), and run() returns once every
  /// connection is done. Before run(): run() returns at once.
  void shutdown();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace serve

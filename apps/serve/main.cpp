// torchattn_serve: a Hugging Face decoder folder (llama, qwen2, qwen3, mistral) served over
// OpenAI's API, many users at once from one pool of KV blocks (models::Engine).
//
//   torchattn_serve MODEL_DIR [--host 127.0.0.1] [--port 8080] [--api-key KEY]
//                   [--kv-tokens 16384] [--max-running 32] [--max-waiting 256] ...
//   torchattn_serve --model MODEL_DIR ...   (as the other apps)
//
//   body='{"model": "smollm2", "messages": [{"role": "user", "content": "Hi!"}]}'
//   curl http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' -d "$body"
//
// Prints "torchattn_serve: listening on http://HOST:PORT ..." on stdout once it
// listens (with --port 0, on a free port). SIGINT or SIGTERM cancels what runs and
// exits 0.

#include "cli_checks.h"
#include "fmt.h"
#include "model_source.h"
#include "server.h"

#include <torchattn/models.h>

#include <CLI/CLI.hpp>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <csignal>
#include <cstdio>
#include <csignal>
#include <filesystem>
#include <thread>
#include <vector>

#include <pthread.h>

int main(int argc, char** argv) {
  CLI::App app{"Serves a Hugging Face decoder folder over OpenAI's API (chat and text completions, streamed or not)"};
  namespace models = torchattn::models;
  // The flags write into the options themselves (TORCH_ARG's accessors return references).
  std::string model_dir;
  std::string model_argument, model_flag;  // the argument or --model: one of them
  serve::ServerOptions server;
  models::LoadOptions load;
  models::EngineOptions engine_options;
  int threads = 0;
  app.add_option("model", model_argument,
                 "a Hugging Face model folder (llama, qwen2, qwen3, mistral, gemma2) or a GGUF file (llama, qwen2); "
                 "or give it as --model")
      ->check(apps::folder_or_gguf());
  app.add_option("--model", model_flag, "the model folder, as the other programs take it (instead of the argument)")
      ->check(apps::folder_or_gguf());
  app.add_option("--host", server.host(), "the address to listen on")->capture_default_str();
  app.add_option("--port", server.port(), "the port to listen on; 0: a free one")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  app.add_option("--api-key", server.api_key(), "require 'Authorization: Bearer KEY' (all routes but /health)");
  app.add_option("--model-name", server.model_name(), "the model's id in the API (default: the folder's name)");
  app.add_option_function<std::string>(
         "--dtype", [&](const std::string& name) { load.weight_format(torchattn::weight_format_from_string(name)); },
         "the weights' format: float32, bfloat16, int8, dynamic-int8 or int4 (float32 activations; docs/models.md)")
      ->check(CLI::IsMember({"float32", "bfloat16", "int8", "dynamic-int8", "int4"}))
      ->default_str("float32");
  app.add_flag_callback(
      "--no-verify-weights", [&] { load.verify_weights(false); },
      "skip the check of a saved folder's weights against their recorded checksums (LoadOptions::verify_weights)");
  app.add_option("--context-length", load.context_length(),
                 "the most tokens of a request, prompt and answer "
                 "(default: the config's max_position_embeddings, at most 4096)")
      ->check(apps::at_least(1));
  app.add_option("--kv-tokens", engine_options.kv_tokens(),
                 "tokens the KV pool holds over all requests (at least "
                 "the context length)")
      ->check(apps::at_least(1))
      ->capture_default_str();
  app.add_option("--block-size", engine_options.block_size(), "tokens per KV block")
      ->check(apps::at_least(1))
      ->capture_default_str();
  app.add_option("--max-running", engine_options.max_running(), "requests generated at once")
      ->check(apps::at_least(1))
      ->capture_default_str();
  app.add_option("--max-waiting", engine_options.max_waiting(), "requests queued; more get 503")
      ->check(apps::at_least(0))
      ->capture_default_str();
  app.add_option("--prefill-chunk", engine_options.prefill_chunk(),
                 "prompts are prefilled in chunks of this many "
                 "tokens")
      ->check(apps::at_least(1))
      ->capture_default_str();
  app.add_option("--max-prefill-tokens", engine_options.max_prefill_tokens(),
                 "prompt tokens per step, over all "
                 "prompts, while many requests decode")
      ->check(apps::at_least(1))
      ->capture_default_str();
  app.add_option("--idle-prefill-tokens", engine_options.idle_prefill_tokens(),
                 "prompt tokens per step while none "
                 "decodes; beside d decoding requests this over d, at least --max-prefill-tokens")
      ->check(apps::at_least(1))
      ->capture_default_str();
  app.add_option("--long-prefill-threshold", engine_options.long_prefill_threshold(),
                 "a prompt with more tokens "
                 "left is long")
      ->check(apps::at_least(0))
      ->capture_default_str();
  app.add_option("--long-prefill-tokens", engine_options.long_prefill_tokens(),
                 "tokens a long prompt brings per "
                 "step while others decode")
      ->check(apps::at_least(1))
      ->capture_default_str();
  app.add_option("--max-body-bytes", server.max_body_bytes(), "larger request bodies get 413")
      ->check(apps::at_least(1))
      ->capture_default_str();
  app.add_option("--max-connections", server.max_connections(),
                 "connections held at once; past it a new one closes the oldest idle one, and when each is busy "
                 "only /health and /stats are answered on a few more")
      ->check(apps::at_least(1))
      ->capture_default_str();
  app.add_option("--timeout", server.timeout_seconds(),
                 "seconds for a request's line and headers; its body gets 3 times it, and a connection idle "
                 "between requests closes after 3 times it")
      ->check(apps::at_least(1))
      ->capture_default_str();
  app.add_option("--threads", threads, "intra-op threads (default: LibTorch's)")->check(apps::at_least(1));
  app.add_flag_callback(
      "--no-prefix-cache", [&] { engine_options.prefix_cache(false); },
      "compute every prompt in "
      "full (default: reuse the KV blocks of earlier requests' identical prefixes)");
  app.add_flag_callback("--quiet", [&] { server.log(false); }, "no line per request on stderr");
  CLI11_PARSE(app, argc, argv);
  if (model_argument.empty() == model_flag.empty()) {
    if (model_argument.empty()) {
      fmt::print(stderr, "torchattn_serve: model: a model folder is required, as the argument or as --model\n");
    } else {
      fmt::print(stderr,
                 "torchattn_serve: model: the model folder was given twice ('{}' and --model '{}'); give it once, as "
                 "the argument or as --model\n",
                 model_argument, model_flag);
    }
    return 2;
  }
  model_dir = model_argument.empty() ? model_flag : model_argument;
  if (threads > 0) at::set_num_threads(threads);
  auto& name = server.model_name();
  if (name.empty()) {
    const std::filesystem::path path = std::filesystem::path(model_dir).lexically_normal();
    // A GGUF file is named by its stem: "SmolLM2-135M-Instruct.Q4_1" for SmolLM2-135M-Instruct.Q4_1.gguf.
    name = (models::is_gguf_file(model_dir) ? path.stem() : path.filename()).string();
  }
  if (name.empty()) name = "model";

  // SIGINT and SIGTERM go to one thread that shuts the server down (blocked here, before
  // any other thread starts, so that every thread inherits the mask).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  try {
    // The context, checked against the model and the pool before the weights load.
    const auto config = apps::decoder_config(model_dir);
    const int64_t positions = config.max_position_embeddings;
    auto& context = load.context_length();
    const bool context_given = context.has_value();
    if (context_given && *context > positions) {
      throw std::runtime_error(fmt::format("--context-length {} is past the model's {} positions ({})", *context,
                                           positions, apps::positions_source(model_dir)));
    }
    if (!context_given) context = std::min<int64_t>(positions, 4096);
    const int64_t kv_tokens = engine_options.kv_tokens(), block_size = engine_options.block_size();
    const int64_t pool = (kv_tokens + block_size - 1) / block_size * block_size;
    if (pool < *context) {
      if (context_given) {
        throw std::runtime_error(fmt::format(
            "--kv-tokens {} is less than --context-length {}: one request may hold {} tokens; give --kv-tokens {} or "
            "more, or a smaller --context-length",
            kv_tokens, *context, *context, *context));
      }
      fmt::print(stderr,
                 "torchattn_serve: the context is {} tokens, the KV pool's size (--kv-tokens {}), not {}: "
                 "give --kv-tokens {} for the whole context\n",
                 pool, kv_tokens, *context, *context);
      context = pool;
    }
    auto lm = models::LanguageModel::from_pretrained(model_dir, load);
    models::Engine engine(lm.model(), engine_options);
    serve::Server http(lm, engine, server);
    const int port = http.bind();
    std::thread watcher([&] {
      int got = 0;
      sigwait(&signals, &got);
      fmt::print(stderr, "torchattn_serve: {}: cancelling what runs and stopping\n",
                 got == SIGINT ? "SIGINT" : "SIGTERM");
      http.shutdown();
    });
    fmt::print("torchattn_serve: listening on http://{}:{}, model {} (context {} tokens, KV pool {} tokens, {} MiB)\n",
               server.host(), port, server.model_name(), lm.model()->context_length(),
               engine.cache().num_blocks() * engine.cache().block_size(),
               engine.cache().num_blocks() * engine.cache().bytes_per_block() >> 20);
    std::fflush(stdout);
    http.run();
    watcher.join();
  } catch (const c10::Error& e) {
    fmt::print(stderr, "torchattn_serve: {}\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "torchattn_serve: {}\n", e.what());
    return 1;
  }
  fmt::print(stderr, "torchattn_serve: stopped\n");
  return 0;
}

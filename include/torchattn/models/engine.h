#pragma once

// Continuous batching: many requests generated at once from one pool of KV blocks, as
// a serving engine does (vLLM, llama.cpp's server). Requests join and leave the
// running batch at every step; long prompts are prefilled in chunks beside the
// sequences that decode, so those keep going; each request finishes on its own.
//
//   auto lm = torchattn::models::LanguageModel::from_pretrained("SmolLM2-135M-Instruct");
//   torchattn::models::Engine engine(lm.model(), torchattn::models::EngineOptions().kv_tokens(16384));
//   auto id = engine.submit(lm.tokenizer().encode(lm.chat_prompt("Hi!")),
//                           torchattn::models::GenerationOptions().max_new_tokens(64),
//                           [](const torchattn::models::TokenEvent& e) { /* e.token, e.finished */ });
//   while (engine.step()) {}  // or a thread: while (running) { engine.wait_for_work(); engine.step(); }

#include <torchattn/models/causal_lm.h>
#include <torchattn/models/generation.h>

#include <torchattn/paged_kv_cache.h>

#include <torch/arg.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torchattn::models {

struct EngineOptions {
  /// Tokens the KV pool holds over all requests (rounded up to whole blocks): the
  /// pool's size, allocated once (on the CPU its memory becomes resident as blocks are
  /// first used). Default: 16384.
  TORCH_ARG(int64_t, kv_tokens) = 16384;
  /// Tokens per KV block (>= 1). Default: 16.
  TORCH_ARG(int64_t, block_size) = 16;
  /// The most requests in the running batch (decoding or prefilling); more wait.
  /// Default: 32.
  TORCH_ARG(int64_t, max_running) = 32;
  /// Prompts are prefilled in chunks that end at multiples of this many tokens (and
  /// at the prompt's end): the most prompt tokens a request brings in a step. A step's
  /// budget (max_prefill_tokens, long_prefill_tokens) may cut a chunk in two. On the CPU
  /// in float32 with pack_weights and chunks of at most 64 tokens, every row is
  /// computed alike however its prompt is cut and whatever shares its step, so a
  /// request's numbers never depend on the other requests; elsewhere up to float
  /// rounding. Default: 32.
  TORCH_ARG(int64_t, prefill_chunk) = 32;
  /// Prompt tokens per step over all prefilling requests while many requests decode
  /// (a prompt's chunk is cut to what is left of it; the rest goes in later steps):
  /// the bound on how long a step of the decoding requests takes while prompts arrive.
  /// Default: 32.
  TORCH_ARG(int64_t, max_prefill_tokens) = 32;
  /// Prompt tokens per step while no request decodes; beside d decoding requests a
  /// step brings up to idle_prefill_tokens / d (never fewer than max_prefill_tokens).
  /// The prompt tokens of a step times the requests it delays stay within this
  /// product: a burst of new requests is prefilled in a few large steps while few
  /// decode, in small ones once many do. At most max_prefill_tokens for a fixed
  /// budget. A prompt brings at most its next chunk (prefill_chunk) a step whatever
  /// the budget.
  /// Default: 512.
  TORCH_ARG(int64_t, idle_prefill_tokens) = 512;
  /// A request with more prompt tokens left than this is a long prompt: while other
  /// requests decode it brings at most long_prefill_tokens a step (as vLLM's
  /// long_prefill_token_threshold), so that a long prompt slows their steps a little
  /// for longer, not a lot; while none decodes it goes chunk by chunk as any prompt.
  /// Default: 256.
  TORCH_ARG(int64_t, long_prefill_threshold) = 256;
  /// The most tokens a long prompt brings in a step beside decoding requests (on a
  /// 2-core CPU with SmolLM2-135M, 8 keeps 16 decoding requests' time per token under
  /// 4x a lone request's while a 2,000-token prompt arrives: apps/bench/results/serve.md).
  /// prefill_chunk or more for no limit. Default: 8.
  TORCH_ARG(int64_t, long_prefill_tokens) = 8;
  /// The most requests waiting to start; submit() beyond it is refused (EngineFull).
  /// Default: 256.
  TORCH_ARG(int64_t, max_waiting) = 256;
  /// Run every linear layer on packed weights, whatever a step's rows (see
  /// CausalLMImpl::pack_weights with min_rows 1): faster batches, and each request's
  /// numbers independent of what shares its steps. CPU float32 only; a second copy of
  /// the weights. Default: true.
  TORCH_ARG(bool, pack_weights) = true;
  /// Prefix caching: the full KV blocks of every request are published under their
  /// tokens (PagedKVCache::publish), and a request whose tokens start with published
  /// blocks (a shared system prompt, the earlier turns of a conversation, the same
  /// prompt again) starts with them instead of computing them. Blocks no request holds
  /// stay for reuse, in memory the pool already used: they are given back (least
  /// recently released first) before a block the pool never used is taken. On the CPU
  /// in float32 with pack_weights and prefill_chunk <= 64 (every row then computed alike
  /// whatever shares its step, by the paged kernel), the reused keys and values are the
  /// bits the request would compute and its tokens are unchanged; elsewhere they are
  /// equal up to float rounding. Default: true.
  TORCH_ARG(bool, prefix_cache) = true;
};

enum class FinishReason {
  Stop,       // a stop token (or the model's EOS) came; it is the last token
  Length,     // max_new_tokens, or the model's context_length
  Cancelled,  // cancel() was called
  Error,      // the request could not go on: TokenEvent::error says why (the model's logits were not finite)
};

/// "stop", "length", "cancelled" or "error".
const char* finish_reason_name(FinishReason reason);

/// What a request's callback hears: a new token, and with the last event, why it
/// ended (a cancelled request's last event has no token).
struct TokenEvent {
  int64_t request = 0;
  std::optional<int64_t> token;
  std::optional<FinishReason> finished;
  int64_t prompt_tokens = 0;
  int64_t generated = 0;                  // tokens generated so far, this one included
  std::optional<TokenLogprobs> logprobs;  // with a token, when GenerationOptions::logprobs >= 0
  std::string error;                      // with FinishReason::Error: why, in words (no token then)
};

using TokenCallback = std::function<void(const TokenEvent&)>;

/// submit() refused: the queue of waiting requests is full (a server answers 503).
class EngineFull : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct EngineStats {
  int64_t running = 0;               // requests in the running batch
  int64_t waiting = 0;               // requests waiting to start (or to resume after preemption)
  int64_t kv_blocks = 0;             // blocks in the pool
  int64_t kv_blocks_used = 0;        // blocks holding tokens
  int64_t kv_bytes_used = 0;         // their bytes, every layer, keys and values
  int64_t tokens_held = 0;           // tokens the running requests hold in the pool
  int64_t steps = 0;                 // steps run so far
  int64_t finished = 0;              // requests finished (any reason)
  int64_t preempted = 0;             // times a running request gave its blocks back to make room
  int64_t kv_blocks_reusable = 0;    // blocks no request holds, kept for prefix reuse (free when needed)
  int64_t prefix_reused_tokens = 0;  // tokens requests took from the prefix cache (a preempted one's own included)
};

/// Runs requests on a CausalLM with a PagedKVCache: submit() from any thread; one
/// thread calls step() (or wait_for_work() then step()) in a loop.
///
/// Each step: cancelled requests leave (their blocks go back to the pool); every
/// decoding request brings its next token; prefilling requests bring their next
/// chunks (within the step's prompt budget, see EngineOptions); waiting requests are
/// admitted while the batch has room and the pool can hold their prompt. Then one
/// forward over all of it (CausalLMImpl::forward_paged), and each request that reached
/// a new token samples it with its own Sampler (seeded: the same tokens alone or in
/// any company). A request finishes on a stop token, max_new_tokens or the context
/// length, or when cancelled, and its blocks return at once.
///
/// With prefix_cache (the default), a request starts with the published KV blocks of
/// the longest prefix of its tokens that earlier requests computed (PagedKVCache::publish).
///
/// When the pool cannot hold the next tokens of the running requests, the newest is
/// preempted: its blocks go back, and it waits at the head of the queue to be
/// prefilled again with its prompt and the tokens it already has (nothing is lost; its
/// later tokens equal an uninterrupted run's up to float rounding).
///
/// A request gets the tokens it gets alone: its chunks, its decoding rows (one CPU
/// kernel per sequence) and, with pack_weights, its rows of every product are computed
/// the same whatever else runs and however its prompt is cut. The engine sets the
/// model's packing (pack_weights) and eval mode.
class Engine {
 public:
  Engine(CausalLM model, const EngineOptions& options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Queues a request: prompt token ids (non-empty, each in the vocabulary), and the
  /// generation options (max_new_tokens, sampling, seed, stop tokens, logit_bias,
  /// penalties, logprobs; on_token is not used: `callback` hears every token), checked
  /// by check_generation_options. The prompt and max_new_tokens must fit the
  /// model's context_length and the pool; otherwise an error naming the numbers.
  /// Thread-safe. Throws EngineFull when max_waiting requests wait already. The
  /// callback runs on the stepping thread, without the engine's lock (it may call
  /// cancel()).
  int64_t submit(std::vector<int64_t> prompt, const GenerationOptions& options, TokenCallback callback);

  /// Ends a request at the next step (its callback hears Cancelled); unknown or
  /// finished ids are ignored. Thread-safe.
  void cancel(int64_t request);

  /// One step (see above). Returns false when there was nothing to do. One thread.
  bool step();

  /// Blocks until a request is waiting or running, or `timeout` passes, or stop_waiting().
  void wait_for_work(std::chrono::milliseconds timeout = std::chrono::milliseconds(100));
  /// Wakes wait_for_work() (at shutdown).
  void stop_waiting();

  /// Runs `prompts` to the end through the engine (a convenience over submit and
  /// step, from the stepping thread): the results in the prompts' order.
  std::vector<GenerationResult> generate(const std::vector<std::vector<int64_t>>& prompts,
                                         const GenerationOptions& options = {});

  EngineStats stats() const;
  const EngineOptions& options() const;
  const PagedKVCache& cache() const;
  CausalLM& model();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace torchattn::models

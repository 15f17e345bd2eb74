#pragma once

// The serving engine's policy: which requests run in a step and with how many tokens,
// which wait, which give their blocks back. No model here: it plans a step over a
// PagedKVCache (taking and returning sequences) and the engine runs it.
//
// A request's tokens are its prompt and then what it generated; `cached` of them are
// in the cache. Each step a running request brings tokens[cached ..]: its next
// token when only one is left (decoding), else its next prefill chunk, which ends at
// the next multiple of prefill_chunk or at the last token, cut to what is left of the
// step's prompt budget (and to long_prefill_tokens for a long prompt beside decoding
// requests). It samples when the step brings its last known token.

#include <torchattn/models/engine.h>
#include <torchattn/models/sampler.h>

#include <torchattn/paged_kv_cache.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

namespace torchattn::models::serving {

struct Request {
  int64_t id = 0;
  std::vector<int64_t> tokens;  // the prompt, then the generated tokens
  int64_t prompt_tokens = 0;
  int64_t max_new_tokens = 0;
  std::vector<int64_t> stop;  // token ids that end it
  std::unique_ptr<Sampler> sampler;
  int64_t logprobs = -1;  // GenerationOptions::logprobs
  TokenCallback callback;
  int64_t sequence = -1;  // its sequence in the cache while running
  int64_t cached = 0;     // tokens written in the cache
  int64_t admitted = 0;   // admission order (the newest is preempted first)
  bool cancelled = false;

  int64_t generated() const { return static_cast<int64_t>(tokens.size()) - prompt_tokens; }
  int64_t pending() const { return static_cast<int64_t>(tokens.size()) - cached; }
};

/// One step's plan: what each running request brings, in the order of the step.
struct Plan {
  std::vector<Request*> requests;
  std::vector<StepTokens> tokens;  // the cache's view of the same
  std::vector<bool> samples;       // brings its last known token: a new one is sampled
};

class Scheduler {
 public:
  explicit Scheduler(const EngineOptions& options) : options_(options) {}

  /// A new request, at the end of the queue.
  void enqueue(std::unique_ptr<Request> request);

  /// Takes the cancelled requests out (their sequences removed from the cache).
  std::vector<std::unique_ptr<Request>> take_cancelled(PagedKVCache& cache);

  /// Plans the next step: preempts the newest running requests while the pool cannot
  /// hold the decoding tokens, continues prefills, admits waiting requests while the
  /// batch and the pool have room. Empty when there is nothing to run.
  Plan plan(PagedKVCache& cache);

  /// Takes a finished request out of the running batch (its sequence removed).
  std::unique_ptr<Request> finish(Request* request, PagedKVCache& cache);

  Request* find(int64_t id);
  int64_t running() const { return static_cast<int64_t>(running_.size()); }
  int64_t waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t preempted() const { return preempted_; }
  /// Tokens admitted requests took from the prefix cache.
  int64_t reused() const { return reused_; }
  /// Tokens the running requests hold in the cache.
  int64_t tokens_held() const;

 private:
  // The tokens `r` brings next: 1 when decoding, else its next chunk.
  int64_t next_count(const Request& r) const;
  void preempt(Request* r, PagedKVCache& cache);
  // The prompt tokens a step may bring beside `decoding` decoding requests:
  // idle_prefill_tokens shared among them, at least max_prefill_tokens.
  int64_t prefill_budget(int64_t decoding) const;

  EngineOptions options_;
  std::deque<std::unique_ptr<Request>> waiting_;
  std::vector<std::unique_ptr<Request>> running_;  // in admission order
  int64_t admissions_ = 0;
  int64_t preempted_ = 0;
  int64_t reused_ = 0;
};

}  // namespace torchattn::models::serving

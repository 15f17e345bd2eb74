#include <torchattn/models/engine.h>

#include "models/generation/finite_logits.h"
#include "models/serving/scheduler.h"

#include <ATen/ops/argmax.h>
#include <ATen/ops/tensor.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>

namespace torchattn::models {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::Stop:
      return "stop";
    case FinishReason::Length:
      return "length";
    case FinishReason::Cancelled:
      return "cancelled";
    case FinishReason::Error:
      return "error";
  }
  return "unknown";
}

struct Engine::State {
  State(CausalLM m, const EngineOptions& o) : model(std::move(m)), options(o), scheduler(o), cache(make_cache()) {}

  PagedKVCache make_cache() {
    TORCH_CHECK(options.kv_tokens() >= 1, "Engine: expected kv_tokens >= 1, got ", options.kv_tokens());
    TORCH_CHECK(options.block_size() >= 1, "Engine: expected block_size >= 1, got ", options.block_size());
    TORCH_CHECK(options.max_running() >= 1, "Engine: expected max_running >= 1, got ", options.max_running());
    TORCH_CHECK(options.prefill_chunk() >= 1, "Engine: expected prefill_chunk >= 1, got ", options.prefill_chunk());
    TORCH_CHECK(options.max_prefill_tokens() >= 1, "Engine: expected max_prefill_tokens >= 1, got ",
                options.max_prefill_tokens());
    TORCH_CHECK(options.idle_prefill_tokens() >= 1, "Engine: expected idle_prefill_tokens >= 1, got ",
                options.idle_prefill_tokens());
    TORCH_CHECK(options.long_prefill_threshold() >= 0, "Engine: expected long_prefill_threshold >= 0, got ",
                options.long_prefill_threshold());
    TORCH_CHECK(options.long_prefill_tokens() >= 1, "Engine: expected long_prefill_tokens >= 1, got ",
                options.long_prefill_tokens());
    TORCH_CHECK(options.max_waiting() >= 0, "Engine: expected max_waiting >= 0, got ", options.max_waiting());
    const int64_t blocks = (options.kv_tokens() + options.block_size() - 1) / options.block_size();
    // Under InferenceMode: the pool holds inference tensors, written by every step.
    c10::InferenceMode inference;
    return model->make_paged_kv_cache(PagedKVCacheOptions(blocks).block_size(options.block_size()));
  }

  // The events a step delivers, each to its request's callback, after its lock.
  using Events = std::vector<std::pair<TokenCallback, TokenEvent>>;
  // The packed inputs of a step's forward.
  struct Batch {
    PagedStep step;
    at::Tensor ids;   // [N] the planned tokens, one request after another
    at::Tensor rows;  // [R] the rows whose logits sample a token (undefined: none)
  };

  // Engine::step's jobs, in order.
  void take_submitted();
  int64_t drop_cancelled(Events& events);
  Batch build_batch(const serving::Plan& plan);
  at::Tensor run_forward(const Batch& batch);
  int64_t sample_and_finish(const serving::Plan& plan, const at::Tensor& logits, Events& events);
  void publish_stats(bool stepped, int64_t finished);

  CausalLM model;
  EngineOptions options;
  // Guards what submit(), cancel() and stats() touch: the incoming queue, the ids,
  // the cancel marks and the stats.
  mutable std::mutex mutex;
  std::condition_variable work;
  bool stop = false;
  std::vector<std::unique_ptr<serving::Request>> incoming;
  std::vector<int64_t> cancels;
  int64_t next_id = 1;
  int64_t waiting_or_running = 0;  // submitted and not finished
  EngineStats stats;
  // The stepping thread's own.
  serving::Scheduler scheduler;
  PagedKVCache cache;
};

Engine::Engine(CausalLM model, const EngineOptions& options)
    : state_(std::make_unique<State>(std::move(model), options)) {
  auto& m = state_->model;
  m->eval();
  const auto& w = m->embed_tokens->weight;
  m->pack_weights(options.pack_weights() && w.is_cpu() && w.scalar_type() == at::kFloat, /*min_rows=*/1);
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->stats.kv_blocks = state_->cache.num_blocks();
}

Engine::~Engine() = default;

int64_t Engine::submit(std::vector<int64_t> prompt, const GenerationOptions& options, TokenCallback callback) {
  State& s = *state_;
  const auto& config = s.model->config();
  TORCH_CHECK(!prompt.empty(), "Engine: submit expected a prompt of at least one token, got none");
  for (const int64_t id : prompt) {
    TORCH_CHECK(id >= 0 && id < config.vocab_size, "Engine: the prompt has token id ", id,
                ", outside the vocabulary [0, ", config.vocab_size, ")");
  }
  check_generation_options(options, config.vocab_size, "Engine");
  const int64_t context = s.model->context_length();
  const auto n = static_cast<int64_t>(prompt.size());
  TORCH_CHECK(n + options.max_new_tokens() <= context, "Engine: ", n,
              " prompt tokens and max_new_tokens=", options.max_new_tokens(), " pass the model's context_length of ",
              context);
  const int64_t pool = s.cache.num_blocks() * s.cache.block_size();
  TORCH_CHECK(n + options.max_new_tokens() <= pool, "Engine: ", n,
              " prompt tokens and max_new_tokens=", options.max_new_tokens(), " pass the KV pool of ", pool,
              " tokens (EngineOptions::kv_tokens)");
  auto r = std::make_unique<serving::Request>();
  r->tokens = std::move(prompt);
  r->prompt_tokens = n;
  r->max_new_tokens = options.max_new_tokens();
  r->stop = options.stop_token_ids();
  if (options.stop_at_eos()) r->stop.insert(r->stop.end(), config.eos_token_ids.begin(), config.eos_token_ids.end());
  r->sampler = std::make_unique<Sampler>(sampling_options(options));
  r->logprobs = options.logprobs();
  r->callback = std::move(callback);
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.stats.waiting + static_cast<int64_t>(s.incoming.size()) >= s.options.max_waiting()) {
    throw EngineFull("Engine: " + std::to_string(s.options.max_waiting()) + " requests wait already (max_waiting)");
  }
  r->id = s.next_id++;
  const int64_t id = r->id;
  s.incoming.push_back(std::move(r));
  ++s.waiting_or_running;
  s.work.notify_all();
  return id;
}

void Engine::cancel(int64_t request) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->cancels.push_back(request);
  state_->work.notify_all();
}

void Engine::wait_for_work(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(state_->mutex);
  state_->work.wait_for(lock, timeout, [&] { return state_->stop || state_->waiting_or_running > 0; });
}

void Engine::stop_waiting() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->stop = true;
  state_->work.notify_all();
}

bool Engine::step() {
  State& s = *state_;
  s.take_submitted();
  State::Events events;
  int64_t finished = s.drop_cancelled(events);
  const serving::Plan plan = s.scheduler.plan(s.cache);
  if (!plan.tokens.empty()) {
    c10::InferenceMode inference;
    const State::Batch batch = s.build_batch(plan);
    finished += s.sample_and_finish(plan, s.run_forward(batch), events);
  }
  s.publish_stats(!plan.tokens.empty(), finished);
  for (auto& [callback, event] : events) {
    if (callback) callback(event);
  }
  return !plan.tokens.empty() || !events.empty();
}

// What came from other threads: new requests join the queue, cancelled ones are marked.
void Engine::State::take_submitted() {
  std::vector<std::unique_ptr<serving::Request>> submitted;
  std::vector<int64_t> cancelled;
  {
    std::lock_guard<std::mutex> lock(mutex);
    submitted.swap(incoming);
    cancelled.swap(cancels);
  }
  for (auto& r : submitted) scheduler.enqueue(std::move(r));
  for (const int64_t id : cancelled) {
    if (serving::Request* r = scheduler.find(id)) r->cancelled = true;
  }
}

// The cancelled requests leave (their blocks go back), each with a Cancelled event: how many.
int64_t Engine::State::drop_cancelled(Events& events) {
  int64_t dropped = 0;
  for (auto& r : scheduler.take_cancelled(cache)) {
    events.push_back({std::move(r->callback), TokenEvent{r->id, std::nullopt, FinishReason::Cancelled, r->prompt_tokens,
                                                         r->generated(), std::nullopt, ""}});
    ++dropped;
  }
  return dropped;
}

// The plan's tokens packed one request after another, their cache step, and the rows
// whose logits are needed (each sampling request's last token).
Engine::State::Batch Engine::State::build_batch(const serving::Plan& plan) {
  PagedStep step = cache.begin_step(plan.tokens);
  std::vector<int64_t> ids, rows;
  for (size_t i = 0; i < plan.requests.size(); ++i) {
    const serving::Request& r = *plan.requests[i];
    ids.insert(ids.end(), r.tokens.begin() + r.cached, r.tokens.begin() + r.cached + plan.tokens[i].count);
    if (plan.samples[i]) rows.push_back(step.query_start[i + 1] - 1);
  }
  const auto device = model->embed_tokens->weight.device();
  return {std::move(step), at::tensor(ids, at::kLong).to(device),
          rows.empty() ? at::Tensor() : at::tensor(rows, at::kLong)};
}

// One forward over the batch: the logits of its sampling rows.
at::Tensor Engine::State::run_forward(const Batch& batch) {
  return model->forward_paged(batch.ids, cache, batch.step, batch.rows);
}

// Each planned request moves past its tokens (publishing its filled blocks); those that
// brought their last token get the next one, and finish on a stop token, max_new_tokens
// or the context length: how many finished.
int64_t Engine::State::sample_and_finish(const serving::Plan& plan, const at::Tensor& logits, Events& events) {
  // Greedy rows take one argmax over them all; sampled ones their own Sampler.
  std::vector<int64_t> greedy;
  std::vector<bool> finite;
  if (std::find(plan.samples.begin(), plan.samples.end(), true) != plan.samples.end()) {
    const at::Tensor top = logits.argmax(-1).to(at::kCPU);
    greedy.assign(top.const_data_ptr<int64_t>(), top.const_data_ptr<int64_t>() + top.numel());
    finite = generation::finite_rows(logits);
  }
  std::vector<serving::Request*> done;
  size_t row = 0;
  for (size_t i = 0; i < plan.requests.size(); ++i) {
    serving::Request& r = *plan.requests[i];
    r.cached += plan.tokens[i].count;
    if (options.prefix_cache()) cache.publish(r.sequence, r.tokens);  // its blocks filled so far
    if (!plan.samples[i]) continue;
    if (!finite[row]) {
      // The model could not give this request a token: it ends with an error, the
      // others go on (a server answers it, and serves on).
      ++row;
      events.push_back(
          {r.callback,
           TokenEvent{r.id, std::nullopt, FinishReason::Error, r.prompt_tokens, r.generated(), std::nullopt,
                      generation::non_finite_logits("Engine", r.generated() + 1, "request " + std::to_string(r.id))}});
      done.push_back(&r);
      continue;
    }
    const at::Tensor row_logits = logits[static_cast<int64_t>(row)];
    int64_t token = 0;
    if (r.sampler->greedy()) {
      token = greedy[row];
      r.sampler->chose(token);
    } else {
      token = r.sampler->next(row_logits);
    }
    ++row;
    std::optional<TokenLogprobs> logprobs;
    if (r.logprobs >= 0) logprobs = token_logprobs(row_logits, token, r.logprobs);
    r.tokens.push_back(token);
    std::optional<FinishReason> end;
    if (std::find(r.stop.begin(), r.stop.end(), token) != r.stop.end()) {
      end = FinishReason::Stop;
    } else if (r.generated() >= r.max_new_tokens || static_cast<int64_t>(r.tokens.size()) >= model->context_length()) {
      end = FinishReason::Length;
    }
    events.push_back(
        {r.callback, TokenEvent{r.id, token, end, r.prompt_tokens, r.generated(), std::move(logprobs), ""}});
    if (end) done.push_back(&r);
  }
  for (serving::Request* r : done) scheduler.finish(r, cache);  // its callback was copied into events
  return static_cast<int64_t>(done.size());
}

// The stats after a step, for stats() on other threads.
void Engine::State::publish_stats(bool stepped, int64_t finished) {
  std::lock_guard<std::mutex> lock(mutex);
  stats.running = scheduler.running();
  stats.waiting = scheduler.waiting();
  stats.kv_blocks_used = cache.used_blocks();
  stats.kv_bytes_used = cache.used_blocks() * cache.bytes_per_block();
  stats.tokens_held = scheduler.tokens_held();
  stats.steps += stepped ? 1 : 0;
  stats.finished += finished;
  stats.preempted = scheduler.preempted();
  stats.kv_blocks_reusable = cache.reusable_blocks();
  stats.prefix_reused_tokens = scheduler.reused();
  waiting_or_running -= finished;
}

std::vector<GenerationResult> Engine::generate(const std::vector<std::vector<int64_t>>& prompts,
                                               const GenerationOptions& options) {
  std::vector<GenerationResult> results(prompts.size());
  size_t left = prompts.size();
  std::string failure;  // the first request's error, if one ended with one
  for (size_t i = 0; i < prompts.size(); ++i) {
    results[i].prompt_tokens = static_cast<int64_t>(prompts[i].size());
    submit(prompts[i], options, [&, i](const TokenEvent& e) {
      if (e.token) {
        results[i].ids.push_back(*e.token);
        if (options.on_token()) options.on_token()(i, *e.token);
      }
      if (e.finished) {
        results[i].stopped = *e.finished == FinishReason::Stop;
        if (*e.finished == FinishReason::Error && failure.empty()) failure = e.error;
        --left;
      }
    });
  }
  while (left > 0) {
    TORCH_CHECK(step(), "Engine: generate: no step could run with requests left");
  }
  TORCH_CHECK(failure.empty(), failure);
  return results;
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  EngineStats out = state_->stats;
  out.waiting += static_cast<int64_t>(state_->incoming.size());
  return out;
}

const EngineOptions& Engine::options() const { return state_->options; }
const PagedKVCache& Engine::cache() const { return state_->cache; }
CausalLM& Engine::model() { return state_->model; }

}  // namespace torchattn::models

#include <torchattn/models/engine.h>

#include "scheduler.h"

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
    return model->make_paged_cache(PagedKVCacheOptions(blocks).block_size(options.block_size()));
  }

  CausalLM model;
  EngineOptions options;
  // Guards what submit(), cancel() and stats() touch: the incoming queue, the ids,
  // the cancel marks and the stats.
  mutable std::mutex mutex;
  std::condition_variable work;
  bool stop = false;
  std::vector<std::unique_ptr<detail::Request>> incoming;
  std::vector<int64_t> cancels;
  int64_t next_id = 1;
  int64_t waiting_or_running = 0;  // submitted and not finished
  EngineStats stats;
  // The stepping thread's own.
  detail::Scheduler scheduler;
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
  auto r = std::make_unique<detail::Request>();
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
  // What came from other threads.
  std::vector<std::unique_ptr<detail::Request>> incoming;
  std::vector<int64_t> cancels;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    incoming.swap(s.incoming);
    cancels.swap(s.cancels);
  }
  for (auto& r : incoming) s.scheduler.enqueue(std::move(r));
  for (const int64_t id : cancels) {
    if (detail::Request* r = s.scheduler.find(id)) r->cancelled = true;
  }
  std::vector<std::pair<TokenCallback, TokenEvent>> events;
  int64_t finished = 0;
  for (auto& r : s.scheduler.take_cancelled(s.cache)) {
    events.push_back({std::move(r->callback), TokenEvent{r->id, std::nullopt, FinishReason::Cancelled, r->prompt_tokens,
                                                         r->generated(), std::nullopt}});
    ++finished;
  }

  detail::Plan plan = s.scheduler.plan(s.cache);
  if (!plan.tokens.empty()) {
    c10::InferenceMode inference;
    PagedStep step = s.cache.begin_step(plan.tokens);
    std::vector<int64_t> ids, rows;
    for (size_t i = 0; i < plan.requests.size(); ++i) {
      const detail::Request& r = *plan.requests[i];
      ids.insert(ids.end(), r.tokens.begin() + r.cached, r.tokens.begin() + r.cached + plan.tokens[i].count);
      if (plan.samples[i]) rows.push_back(step.query_start[i + 1] - 1);
    }
    const auto device = s.model->embed_tokens->weight.device();
    const at::Tensor logits = s.model->forward_paged(at::tensor(ids, at::kLong).to(device), s.cache, step,
                                                     rows.empty() ? at::Tensor() : at::tensor(rows, at::kLong));
    // Greedy rows take one argmax over them all; sampled ones their own Sampler.
    std::vector<int64_t> greedy;
    if (!rows.empty()) {
      const at::Tensor top = logits.argmax(-1).to(at::kCPU);
      greedy.assign(top.const_data_ptr<int64_t>(), top.const_data_ptr<int64_t>() + top.numel());
    }
    std::vector<detail::Request*> done;
    size_t row = 0;
    for (size_t i = 0; i < plan.requests.size(); ++i) {
      detail::Request& r = *plan.requests[i];
      r.cached += plan.tokens[i].count;
      if (s.options.prefix_cache()) s.cache.publish(r.sequence, r.tokens);  // its blocks filled so far
      if (!plan.samples[i]) continue;
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
      } else if (r.generated() >= r.max_new_tokens ||
                 static_cast<int64_t>(r.tokens.size()) >= s.model->context_length()) {
        end = FinishReason::Length;
      }
      events.push_back({r.callback, TokenEvent{r.id, token, end, r.prompt_tokens, r.generated(), std::move(logprobs)}});
      if (end) done.push_back(&r);
    }
    for (detail::Request* r : done) {
      s.scheduler.finish(r, s.cache);  // its callback was copied into events
      ++finished;
    }
  }
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.stats.running = s.scheduler.running();
    s.stats.waiting = s.scheduler.waiting();
    s.stats.kv_blocks_used = s.cache.used_blocks();
    s.stats.kv_bytes_used = s.cache.used_blocks() * s.cache.bytes_per_block();
    s.stats.tokens_held = s.scheduler.tokens_held();
    s.stats.steps += plan.tokens.empty() ? 0 : 1;
    s.stats.finished += finished;
    s.stats.preempted = s.scheduler.preempted();
    s.stats.kv_blocks_reusable = s.cache.reusable_blocks();
    s.stats.prefix_reused_tokens = s.scheduler.reused();
    s.waiting_or_running -= finished;
  }
  for (auto& [callback, event] : events) {
    if (callback) callback(event);
  }
  return !plan.tokens.empty() || !events.empty();
}

std::vector<GenerationResult> Engine::generate(const std::vector<std::vector<int64_t>>& prompts,
                                               const GenerationOptions& options) {
  std::vector<GenerationResult> results(prompts.size());
  size_t left = prompts.size();
  for (size_t i = 0; i < prompts.size(); ++i) {
    results[i].prompt_tokens = static_cast<int64_t>(prompts[i].size());
    submit(prompts[i], options, [&, i](const TokenEvent& e) {
      if (e.token) {
        results[i].ids.push_back(*e.token);
        if (options.on_token()) options.on_token()(i, *e.token);
      }
      if (e.finished) {
        results[i].stopped = *e.finished == FinishReason::Stop;
        --left;
      }
    });
  }
  while (left > 0) {
    TORCH_CHECK(step(), "Engine: generate: no step could run with requests left");
  }
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

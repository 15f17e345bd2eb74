#include "models/serving/scheduler.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace torchattn::models::serving {

void Scheduler::enqueue(std::unique_ptr<Request> request) { waiting_.push_back(std::move(request)); }

Request* Scheduler::find(int64_t id) {
  for (auto& r : running_) {
    if (r->id == id) return r.get();
  }
  for (auto& r : waiting_) {
    if (r->id == id) return r.get();
  }
  return nullptr;
}

int64_t Scheduler::tokens_held() const {
  int64_t n = 0;
  for (const auto& r : running_) n += r->cached;
  return n;
}

std::vector<std::unique_ptr<Request>> Scheduler::take_cancelled(PagedKVCache& cache) {
  std::vector<std::unique_ptr<Request>> out;
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if ((*it)->cancelled) {
      out.push_back(std::move(*it));
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = running_.begin(); it != running_.end();) {
    if ((*it)->cancelled) {
      cache.remove((*it)->sequence);
      (*it)->sequence = -1;
      out.push_back(std::move(*it));
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

int64_t Scheduler::next_count(const Request& r) const {
  if (r.pending() <= 1) return r.pending();
  const int64_t boundary = (r.cached / options_.prefill_chunk() + 1) * options_.prefill_chunk();
  return std::min<int64_t>(static_cast<int64_t>(r.tokens.size()), boundary) - r.cached;
}

int64_t Scheduler::prefill_budget(int64_t decoding) const {
  return std::max(options_.max_prefill_tokens(), options_.idle_prefill_tokens() / std::max<int64_t>(decoding, 1));
}

void Scheduler::preempt(Request* r, PagedKVCache& cache) {
  cache.remove(r->sequence);
  r->sequence = -1;
  r->cached = 0;  // prefilled again, prompt and generated tokens, when it comes back
  auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& p) { return p.get() == r; });
  TORCH_INTERNAL_ASSERT(it != running_.end());
  waiting_.push_front(std::move(*it));
  running_.erase(it);
  ++preempted_;
}

std::unique_ptr<Request> Scheduler::finish(Request* request, PagedKVCache& cache) {
  auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& p) { return p.get() == request; });
  TORCH_INTERNAL_ASSERT(it != running_.end());
  cache.remove(request->sequence);
  request->sequence = -1;
  std::unique_ptr<Request> out = std::move(*it);
  running_.erase(it);
  return out;
}

Plan Scheduler::plan(PagedKVCache& cache) {
  const int64_t block = cache.block_size();
  auto blocks_for = [&](int64_t tokens) { return (tokens + block - 1) / block; };
  Plan plan;
  for (;;) {
    plan = Plan();
    // Every decoding request brings its token; while the pool cannot hold them, the
    // newest running request gives its blocks back (it is prefilled again later).
    std::vector<StepTokens> decoding;
    for (const auto& r : running_) {
      if (r->pending() == 1) decoding.push_back({r->sequence, 1});
    }
    if (!decoding.empty() && cache.blocks_needed(decoding) > cache.free_blocks() && running_.size() > 1) {
      preempt(running_.back().get(), cache);
      continue;
    }
    int64_t prefill = 0;
    const int64_t budget = prefill_budget(static_cast<int64_t>(decoding.size()));
    auto add = [&](Request* r) {
      int64_t n = next_count(*r);
      const bool decode = r->pending() == 1;
      if (!decode) {  // what is left of the step's budget, up to its next chunk
        if (prefill >= budget) return false;
        n = std::min(n, budget - prefill);
        // A long prompt beside decoding requests: a few tokens a step, so that their
        // steps stay short for as long as it takes.
        if (!decoding.empty() && r->pending() > options_.long_prefill_threshold()) {
          n = std::min(n, options_.long_prefill_tokens());
        }
      }
      plan.tokens.push_back({r->sequence, n});
      if (cache.blocks_needed(plan.tokens) > cache.free_blocks()) {
        plan.tokens.pop_back();
        return false;
      }
      plan.requests.push_back(r);
      plan.samples.push_back(r->cached + n == static_cast<int64_t>(r->tokens.size()));
      if (!decode) prefill += n;
      return true;
    };
    for (const auto& r : running_) {
      if (r->pending() == 1) add(r.get());
    }
    for (const auto& r : running_) {
      if (r->pending() > 1) add(r.get());
    }
    // Admit waiting requests in order while the batch has room, the step has prefill
    // budget, and the pool (after this step) can hold the whole prompt and a token.
    while (!waiting_.empty() && static_cast<int64_t>(running_.size()) < options_.max_running()) {
      Request* r = waiting_.front().get();
      const int64_t free_after = cache.free_blocks() - (plan.tokens.empty() ? 0 : cache.blocks_needed(plan.tokens));
      if (blocks_for(static_cast<int64_t>(r->tokens.size()) + 1) > free_after) break;
      if (prefill >= budget) break;
      r->sequence = options_.prefix_cache() ? cache.add_sequence(r->tokens) : cache.add_sequence();
      r->cached = cache.length(r->sequence);  // a published prefix of its tokens, if any
      reused_ += r->cached;
      r->admitted = admissions_++;
      running_.push_back(std::move(waiting_.front()));
      waiting_.pop_front();
      add(r);
    }
    // Prefills that found no blocks while nothing else runs: make room.
    if (plan.tokens.empty() && running_.size() > 1) {
      preempt(running_.back().get(), cache);
      continue;
    }
    return plan;
  }
}

}  // namespace torchattn::models::serving

#include <torchattn/decode_graph.h>

#include "cache/append_watch.h"

#include <ATen/Context.h>
#include <ATen/ops/empty_like.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#ifdef TORCHATTN_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace torchattn {

namespace cache {
struct CapturedGraph {
#ifdef TORCHATTN_WITH_CUDA
  at::cuda::CUDAGraph graph;
#endif
};
}  // namespace cache

DecodeGraph::DecodeGraph(Step step, std::vector<KVCache*> caches) : step_(std::move(step)), caches_(std::move(caches)) {
  TORCH_CHECK(step_, "DecodeGraph: expected a step function, got an empty one");
  for (size_t i = 0; i < caches_.size(); ++i) {
    TORCH_CHECK(caches_[i] != nullptr && caches_[i]->defined(), "DecodeGraph: cache ", i,
                " is null or empty; pass caches made with make_kv_cache(batch_size, /*static_shapes=*/true)");
    TORCH_CHECK(caches_[i]->static_shapes(), "DecodeGraph: cache ", i,
                " has dynamic shapes; make it with make_kv_cache(batch_size, /*static_shapes=*/true)");
  }
}

DecodeGraph::~DecodeGraph() = default;

bool DecodeGraph::uses_cuda_graph() const { return graph_ != nullptr; }

void DecodeGraph::check_input(const at::Tensor& input) const {
  TORCH_CHECK(input.defined(), "DecodeGraph: expected a defined input");
  TORCH_CHECK(!c10::GradMode::is_enabled(), "DecodeGraph: run it under torch::NoGradGuard or c10::InferenceMode");
  for (size_t i = 0; i < caches_.size(); ++i) {
    TORCH_CHECK(caches_[i]->key_storage().device() == input.device(), "DecodeGraph: cache ", i, " is on ",
                caches_[i]->key_storage().device(), ", the input on ", input.device());
  }
  if (static_input_.defined()) {
    TORCH_CHECK(input.sizes() == static_input_.sizes() && input.scalar_type() == static_input_.scalar_type() &&
                    input.device() == static_input_.device(),
                "DecodeGraph: expected every input shaped like the first, ", static_input_.sizes(), " of ",
                static_input_.scalar_type(), " on ", static_input_.device(), ", got ", input.sizes(), " of ",
                input.scalar_type(), " on ", input.device());
  }
}

at::Tensor DecodeGraph::run_watched(const at::Tensor& input) {
  cache::AppendWatch watch;
  at::Tensor out = step_(input);
  for (const cache::CacheWrite& written : watch.written()) {
    bool listed = false;
    for (const KVCache* c : caches_) listed = listed || c == written.cache;
    TORCH_CHECK(listed, "DecodeGraph: the step wrote a KV cache (", (written.static_shapes ? "static" : "dynamic"),
                " shapes, ", written.length, " tokens) that is not among the ", caches_.size(),
                " caches it was given; list every cache the step writes: DecodeGraph(step, {&cache0, &cache1, ...})");
  }
  return out;
}

void DecodeGraph::check_room(int64_t tokens) const {
  for (size_t i = 0; i < caches_.size(); ++i) {
    const KVCache& c = *caches_[i];
    TORCH_CHECK(c.length() + tokens <= c.capacity(), "DecodeGraph: cache ", i, " holds ", c.length(), " of ",
                c.capacity(), " tokens and cannot take ", tokens, " more; call reset() on the caches to start again");
  }
}

at::Tensor DecodeGraph::operator()(const at::Tensor& input) {
  check_input(input);
  if (!input.is_cuda()) {
    // Eagerly: the caches check their own room and advance themselves.
    std::vector<int64_t> before;
    before.reserve(caches_.size());
    for (KVCache* c : caches_) before.push_back(c->length());
    at::Tensor out = run_watched(input);
    for (size_t i = 0; i < caches_.size(); ++i) {
      const int64_t added = caches_[i]->length() - before[i];
      TORCH_CHECK(i == 0 || added == caches_[0]->length() - before[0], "DecodeGraph: the step added ", added,
                  " tokens to cache ", i, " but ", caches_[0]->length() - before[0], " to cache 0");
      tokens_per_step_ = added;
    }
    if (!static_input_.defined()) {
      static_input_ = at::empty_like(input);  // remembers the shape the next inputs must have
    }
    return out;
  }
#ifdef TORCHATTN_WITH_CUDA
  if (graph_ == nullptr) {
    capture(input);
  }
  check_room(tokens_per_step_);
  for (size_t i = 0; i < caches_.size(); ++i) {
    TORCH_CHECK(caches_[i]->has_padding() == captured_padding_[i], "DecodeGraph: cache ", i,
                (captured_padding_[i] ? " had" : " had no"), " key padding when the step was captured and ",
                (captured_padding_[i] ? "has none" : "has some"), " now; make a new DecodeGraph for this sequence");
  }
  static_input_.copy_(input);
  graph_->graph.replay();
  for (KVCache* c : caches_) {
    c->length_ += tokens_per_step_;
  }
  return static_output_;
#else
  TORCH_CHECK(false, "DecodeGraph: torchattn was built without CUDA, the input is on ", input.device());
#endif
}

void DecodeGraph::capture([[maybe_unused]] const at::Tensor& input) {
#ifdef TORCHATTN_WITH_CUDA
  // Deterministic index_copy_ may synchronise with the host, which capture forbids.
  TORCH_CHECK(!at::globalContext().deterministicAlgorithms(),
              "DecodeGraph: cannot capture with "
              "at::globalContext().setDeterministicAlgorithms(true): the caches' index_copy_ may then synchronise");
  const c10::cuda::CUDAGuard device_guard(input.device());
  std::vector<int64_t> lengths;
  for (KVCache* c : caches_) lengths.push_back(c->length());
  auto rewind = [&] {
    for (size_t i = 0; i < caches_.size(); ++i) caches_[i]->truncate(lengths[i]);
  };
  static_input_ = input.clone();  // on the user's stream, where replays read it
  c10::cuda::device_synchronize();
  // Whatever fails (a check, a warm-up, the capture), the caches go back to where
  // they were and the stream stops capturing.
  std::unique_ptr<cache::CapturedGraph> captured;
  bool capturing = false;
  try {
    // Capture needs a stream other than the default one; warm up on it too.
    c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromPool(false, input.device().index()));
    static_output_ = run_watched(static_input_);
    for (size_t i = 0; i < caches_.size(); ++i) {
      const int64_t added = caches_[i]->length() - lengths[i];
      TORCH_CHECK(added == caches_[0]->length() - lengths[0], "DecodeGraph: the step added ", added,
                  " tokens to cache ", i, " but ", caches_[0]->length() - lengths[0], " to cache 0");
      tokens_per_step_ = added;
    }
    bool room = true;
    for (size_t i = 0; i < caches_.size(); ++i)
      room = room && caches_[i]->length() + tokens_per_step_ <= caches_[i]->capacity();
    if (room) {
      static_output_ = step_(static_input_);  // a second warm-up where there is room
    }
    rewind();
    c10::cuda::device_synchronize();
    captured = std::make_unique<cache::CapturedGraph>();
    captured->graph.capture_begin();
    capturing = true;
    static_output_ = step_(static_input_);
    capturing = false;
    captured->graph.capture_end();
  } catch (...) {
    if (capturing) {
      try {
        captured->graph.capture_end();
      } catch (...) {}
    }
    rewind();
    throw;
  }
  graph_ = std::move(captured);
  captured_padding_.clear();
  for (KVCache* c : caches_) captured_padding_.push_back(c->has_padding());
  rewind();  // the captured step ran nothing; the host lengths it advanced go back
  c10::cuda::device_synchronize();
#else
  TORCH_CHECK(false, "DecodeGraph: torchattn was built without CUDA");
#endif
}

}  // namespace torchattn

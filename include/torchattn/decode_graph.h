#pragma once

#include <torchattn/kv_cache.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace torchattn {

namespace cache {
struct CapturedGraph;
}  // namespace cache

/// One decoding step of a model (any function of one input tensor that runs
/// forward_cached on static-shape caches), captured in a CUDA graph at its first call
/// and replayed for every new token; on other devices the same calls run it eagerly.
/// See docs/gpu.md.
///
///   torch::NoGradGuard no_grad;                       // and model->eval()
///   auto cache = mha->make_kv_cache(1, /*static_shapes=*/true);
///   mha->forward_cached(prompt, cache);               // prefill, eagerly
///   torchattn::DecodeGraph step(
///       [&](const at::Tensor& x) { return mha->forward_cached(x, cache); },
///       {&cache});
///   at::Tensor y = step(x_next);                      // [1, 1, d_out]; captured at the first call
///   y = step(x_after);                                // replayed; cache.length() advances
///
/// Rules (errors where they can be checked):
/// - Every cache the step writes is listed (another one is an error at the first
///   call), static-shape, on the input's device, advanced by the same tokens a step.
/// - Inputs have the shape, dtype and device of the first one.
/// - On CUDA the result is the graph's buffer, overwritten by the next call: clone()
///   what you keep. Host values the step reads are frozen at capture.
/// - NoGradGuard or InferenceMode, eval mode, deterministic algorithms off.
/// - Capture runs the step once or twice to warm up, then rewinds the caches.
/// - reset() or truncate() between sequences is fine; the caches and the model must
///   outlive this. Each cache must have key padding, or not, as at capture (else an
///   error: make a new DecodeGraph).
class DecodeGraph {
 public:
  using Step = std::function<at::Tensor(const at::Tensor& input)>;

  DecodeGraph(Step step, std::vector<KVCache*> caches);
  ~DecodeGraph();
  DecodeGraph(const DecodeGraph&) = delete;
  DecodeGraph& operator=(const DecodeGraph&) = delete;

  /// Runs one step on `input`: eagerly, or (CUDA) by copying it into the static
  /// input and replaying the graph. Checks, on the host, that every cache has room.
  at::Tensor operator()(const at::Tensor& input);

  /// True once a CUDA graph has been captured (never on CPU).
  bool uses_cuda_graph() const;
  /// Tokens each step adds to every cache (known after the first call; 0 before).
  int64_t tokens_per_step() const { return tokens_per_step_; }

 private:
  void capture(const at::Tensor& input);
  // step_(input), refusing a step that appended to a cache not in caches_.
  at::Tensor run_watched(const at::Tensor& input);
  void check_input(const at::Tensor& input) const;
  void check_room(int64_t tokens) const;

  Step step_;
  std::vector<KVCache*> caches_;
  at::Tensor static_input_;
  at::Tensor static_output_;
  int64_t tokens_per_step_ = 0;
  std::unique_ptr<cache::CapturedGraph> graph_;
  // Whether each cache had key padding at capture: the graph reads it, or not.
  std::vector<bool> captured_padding_;
};

}  // namespace torchattn

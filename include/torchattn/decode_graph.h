#pragma once

#include <torchattn/kv_cache.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace torchattn {

namespace detail {
struct CapturedGraph;
}

/// One decoding step of a model, captured in a CUDA graph on CUDA and replayed for
/// every new token; on other devices the same calls run the step eagerly.
///
/// The step reads its input (token ids, embeddings, ...) and runs `forward_cached`
/// on static-shape caches, which write at their device-side position(), so a replay
/// decodes the next token with no host work but one copy and one graph launch.
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
/// Rules:
/// - Every cache the step writes must be listed, be static-shape and on the input's
///   device; the step must advance each of them by the same number of tokens. A step
///   that writes a cache it was not given is an error at the first call (CPU and
///   CUDA: the eager run before capture is watched).
/// - Inputs have the shape, dtype and device of the first one.
/// - On CUDA the returned tensor is the graph's output buffer, overwritten by the
///   next call: clone() what you keep. Host values the step reads are frozen at
///   capture; what changes between steps must live in tensors (the input, the
///   caches' position()).
/// - Run under NoGradGuard or InferenceMode, with dropout off (eval mode): random
///   numbers drawn inside a captured step would repeat at every replay. Not with
///   deterministic algorithms switched on (the cache writes could then synchronise).
/// - Capture runs the step once or twice to warm up (cuBLAS, cuDNN plans) and then
///   rewinds the caches; so it needs room for those tokens in every cache.
/// - cache.reset() or truncate() between sequences is fine: the graph reads the
///   position from the device. The caches and the captured model must outlive this.
/// - A graph captured while the caches had key padding (a left-padded prompt)
///   attends through their padding; one captured without cannot, and replaying it
///   after a padded prompt is an error (make a new DecodeGraph).
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
  std::unique_ptr<detail::CapturedGraph> graph_;
  // Whether each cache had key padding at capture: the graph reads it, or not.
  std::vector<bool> captured_padding_;
};

}  // namespace torchattn

#pragma once

// Whether a tensor takes part in a gradient: the CPU kernels have no autograd, so they
// apply only where no operand does. A forward that activation checkpointing will run
// again with a gradient (torchattn::checkpoint) counts as one: its kernels must be the
// ones the recomputation takes, so that both give the same bits.

#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>

namespace torchattn::kernels::cpu {

namespace detail {
// Set by RecomputedForward on this thread only.
inline thread_local bool recomputed_forward = false;
}  // namespace detail

/// While alive, this thread runs a forward whose results will be recomputed with a
/// gradient: needs_grad() answers true for every defined tensor. Scoped; nests.
class RecomputedForward {
 public:
  RecomputedForward() : outer_(detail::recomputed_forward) { detail::recomputed_forward = true; }
  ~RecomputedForward() { detail::recomputed_forward = outer_; }
  RecomputedForward(const RecomputedForward&) = delete;
  RecomputedForward& operator=(const RecomputedForward&) = delete;

 private:
  bool outer_;
};

/// A defined tensor whose gradient is computed: backward (grad mode on and
/// requires_grad), forward mode (a tangent), or a forward to be recomputed with one.
inline bool needs_grad(const at::Tensor& t) {
  return t.defined() && (detail::recomputed_forward || (c10::GradMode::is_enabled() && t.requires_grad()) ||
                         t._fw_grad(/*level=*/0).defined());
}

}  // namespace torchattn::kernels::cpu

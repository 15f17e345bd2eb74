#pragma once

// flex_attention's node in the autograd graph (flex_attention.h): a
// torch::autograd::Function whose forward is the caller's forward closure and whose
// backward is held, type-erased, in the node (so the node's type does not depend on
// the user's mods). The log-sum-exp is an output without a gradient.

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/custom_function.h>

#include <array>
#include <functional>
#include <tuple>

namespace torchattn::flex {

/// The backward of one call: (q, k, v, out, lse, dout) -> (dq, dk, dv).
struct Backward : torch::CustomClassHolder {
  std::function<std::array<at::Tensor, 3>(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                          const at::Tensor&, const at::Tensor&)>
      run;
};

class FlexFunction : public torch::autograd::Function<FlexFunction> {
 public:
  /// {out, lse} of forward(); q, k and v saved with them for backward.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                                                const at::Tensor& k, const at::Tensor& v,
                                                const std::function<std::tuple<at::Tensor, at::Tensor>()>& forward,
                                                const c10::intrusive_ptr<Backward>& backward) {
    auto [out, lse] = forward();
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["flex_backward"] = c10::IValue::make_capsule(backward);
    ctx->mark_non_differentiable({lse});
    return {out, lse};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const auto backward = c10::static_intrusive_pointer_cast<Backward>(ctx->saved_data["flex_backward"].toCapsule());
    auto [dq, dk, dv] = backward->run(saved[0], saved[1], saved[2], saved[3], saved[4], grads[0]);
    return {dq, dk, dv, at::Tensor(), at::Tensor()};
  }
};

}  // namespace torchattn::flex

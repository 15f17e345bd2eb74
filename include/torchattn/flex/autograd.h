#pragma once

// flex_attention's node in the autograd graph (flex_attention.h): a
// torch::autograd::Function whose forward is the caller's forward closure and whose
// backward is held, type-erased, in the node (so the node's type does not depend on
// the user's mods). Both outputs carry gradients: the log-sum-exp's joins the output's in
// the one backward. There is no second derivative: where a graph of the backward is
// asked for (create_graph), the gradients come back through a node whose own backward
// is an error naming flex_attention.

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <array>
#include <functional>
#include <tuple>

namespace torchattn::flex {

/// The backward of one call: (q, k, v, out, lse, dout, dlse) -> (dq, dk, dv); dout
/// and dlse defined (zeros where the graph gave none).
struct Backward : torch::CustomClassHolder {
  std::function<std::array<at::Tensor, 3>(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                          const at::Tensor&, const at::Tensor&, const at::Tensor&)>
      run;
};

/// The gradients of a backward run with create_graph: the same tensors, attached to the
/// graph through q, k, v and dout so that a backward through them reaches this node,
/// whose backward refuses.
class FlexGradients : public torch::autograd::Function<FlexGradients> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* /*ctx*/, const at::Tensor& dq,
                                                const at::Tensor& dk, const at::Tensor& dv, const at::Tensor& /*q*/,
                                                const at::Tensor& /*k*/, const at::Tensor& /*v*/,
                                                const at::Tensor& /*dout*/) {
    return {dq, dk, dv};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* /*ctx*/,
                                                 const torch::autograd::variable_list& /*grads*/) {
    TORCH_CHECK(false,
                "flex_attention: no double backward: its gradients are computed by a kernel that is not itself "
                "differentiable, so a backward through them (after autograd::grad with create_graph=true) cannot "
                "run. Take second derivatives through functional::attention or ATen's scaled_dot_product_attention");
  }
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
    return {out, lse};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    if (!grads[0].defined() && !grads[1].defined()) {
      return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    }
    const at::Tensor dout = grads[0].defined() ? grads[0] : at::zeros_like(saved[3]);
    const at::Tensor dlse = grads[1].defined() ? grads[1] : at::zeros_like(saved[4]);
    const auto backward = c10::static_intrusive_pointer_cast<Backward>(ctx->saved_data["flex_backward"].toCapsule());
    auto [dq, dk, dv] = backward->run(saved[0], saved[1], saved[2], saved[3], saved[4], dout.detach(), dlse.detach());
    if (at::GradMode::is_enabled()) {  // create_graph: a graph of the gradients is asked for
      auto attached = FlexGradients::apply(dq, dk, dv, saved[0], saved[1], saved[2], dout);
      return {attached[0], attached[1], attached[2], at::Tensor(), at::Tensor()};
    }
    return {dq, dk, dv, at::Tensor(), at::Tensor()};
  }
};

}  // namespace torchattn::flex

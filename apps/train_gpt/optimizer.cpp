#include "optimizer.h"

#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/full.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <map>
#include <memory>

namespace train_gpt {

torch::Tensor FusedAdamW::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups_) {
    auto& o = static_cast<torch::optim::AdamWOptions&>(group.options());
    TORCH_CHECK(!o.amsgrad(), "FusedAdamW: amsgrad is not supported; use --optimizer loop");
    // Parameters by their step count after this step (all the same once every one has
    // had a gradient): one step tensor and one fused call each.
    struct Lists {
      std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
    };
    std::map<int64_t, Lists> by_step;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      TORCH_CHECK(!p.grad().is_sparse(), "FusedAdamW: sparse gradients are not supported");
      auto it = state_.find(p.unsafeGetTensorImpl());
      if (it == state_.end()) {
        auto state = std::make_unique<torch::optim::AdamWParamState>();
        state->step(0);
        state->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        state->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        it = state_.emplace(p.unsafeGetTensorImpl(), std::move(state)).first;
      }
      auto& state = static_cast<torch::optim::AdamWParamState&>(*it->second);
      state.step(state.step() + 1);
      Lists& l = by_step[state.step()];
      l.params.push_back(p);
      l.grads.push_back(p.grad());
      l.exp_avgs.push_back(state.exp_avg());
      l.exp_avg_sqs.push_back(state.exp_avg_sq());
    }
    const auto [beta1, beta2] = o.betas();
    for (auto& [step, l] : by_step) {
      const at::Tensor t = at::full({}, static_cast<double>(step), l.params.front().options().dtype(at::kFloat));
      const std::vector<at::Tensor> steps(l.params.size(), t);
      at::_fused_adamw_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, o.lr(), beta1,
                        beta2, o.weight_decay(), o.eps(), /*amsgrad=*/false, /*maximize=*/false);
    }
  }
  return loss;
}

torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& parameters, double max_norm) {
  std::vector<at::Tensor> grads;
  for (const auto& p : parameters) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return {};
  torch::NoGradGuard no_grad;
  const at::Tensor total = at::stack(at::_foreach_norm(grads, 2)).norm(2);
  const at::Tensor coef = (max_norm / (total + 1e-6)).clamp_max(1.0);
  at::_foreach_mul_(grads, coef);
  return total;
}

OptimizerKind optimizer_kind(const std::string& name, bool cuda) {
  if (name == "loop") return OptimizerKind::Loop;
  if (name == "fused") return OptimizerKind::Fused;
  TORCH_CHECK(name == "auto", "train_gpt: --optimizer expected auto, loop or fused, got '", name, "'");
  return cuda ? OptimizerKind::Fused : OptimizerKind::Loop;
}

}  // namespace train_gpt

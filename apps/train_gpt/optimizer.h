#pragma once

// train_gpt's optimizer step: AdamW and gradient-norm clipping, either as LibTorch's
// C++ API does them (a few kernels per parameter, and a clip that waits for the device
// to return the norm) or fused (at::_fused_adamw_, one kernel a parameter group, as
// PyTorch's AdamW(fused=True); a clip of foreach kernels that returns the norm as a
// tensor, as PyTorch's clip_grad_norm_). On a GPU the host then queues the whole step
// without waiting, and a small model's step is not bound by launches.

#include <torch/optim/adamw.h>
#include <torch/types.h>

#include <string>
#include <vector>

namespace train_gpt {

/// torch::optim::AdamW whose step() runs at::_fused_adamw_ over each group's
/// parameters that have a gradient: the same update (decoupled weight decay, bias
/// corrections), within float32 rounding of AdamW's, and the same state (step,
/// exp_avg, exp_avg_sq per parameter), so checkpoints save and load as AdamW's. No
/// amsgrad (an error naming it), no closure's loss beyond AdamW's.
class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

/// Scales the gradients of `parameters` so that their total 2-norm is at most
/// max_norm, as torch::nn::utils::clip_grad_norm_ (coefficient max_norm / (norm +
/// 1e-6), clamped at 1), with foreach kernels and without reading the norm on the host:
/// returns it as a 0-dim tensor on the gradients' device (undefined without gradients).
torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& parameters, double max_norm);

/// --optimizer: "loop" (torch::optim::AdamW and torch::nn::utils::clip_grad_norm_,
/// the CPU's default and reference curve) or "fused" (the default on CUDA); "auto"
/// picks by the device.
enum class OptimizerKind { Loop, Fused };
OptimizerKind optimizer_kind(const std::string& name, bool cuda);

}  // namespace train_gpt

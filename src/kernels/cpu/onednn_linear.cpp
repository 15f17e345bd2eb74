#include "onednn_linear.h"

#include "linear.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <optional>
#include <vector>

namespace torchattn::kernels::cpu {

namespace {

// The operator, looked up once; none where LibTorch was built without oneDNN.
const std::optional<c10::OperatorHandle>& linear_pointwise() {
  static const std::optional<c10::OperatorHandle> op =
      c10::Dispatcher::singleton().findSchema({"mkldnn::_linear_pointwise", ""});
  return op;
}

bool dense_float_cpu(const at::Tensor& t) {
  return t.is_cpu() && t.scalar_type() == at::kFloat && t.layout() == at::kStrided && t.is_contiguous();
}

} // namespace

bool onednn_linear_applies(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (!linear_pointwise().has_value() || !x.is_cpu() || x.scalar_type() != at::kFloat ||
      x.layout() != at::kStrided || !dense_float_cpu(weight) || weight.dim() != 2 || x.dim() < 1 ||
      x.size(-1) != weight.size(1) || weight.numel() == 0) {
    return false;
  }
  if (bias.defined() && (!dense_float_cpu(bias) || bias.dim() != 1 || bias.size(0) != weight.size(0))) {
    return false;
  }
  const int64_t rows = x.size(-1) == 0 ? 0 : x.numel() / x.size(-1);
  const bool grad = c10::GradMode::is_enabled() &&
                    (x.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad()));
  return rows > kSmallLinearRows && !grad;
}

at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  TORCH_CHECK(onednn_linear_applies(x, weight, bias),
              "onednn_linear: expected float32 CPU rows, a dense weight and no gradient");
  // mkldnn::_linear_pointwise(Tensor X, Tensor W, Tensor? B, str attr, Scalar?[] scalars, str? algorithm)
  torch::jit::Stack stack;
  stack.reserve(6);
  stack.emplace_back(x.contiguous());
  stack.emplace_back(weight);
  stack.emplace_back(bias.defined() ? c10::IValue(bias) : c10::IValue());
  stack.emplace_back(std::string("none"));
  stack.emplace_back(c10::List<std::optional<at::Scalar>>());
  stack.emplace_back(c10::IValue());
  linear_pointwise()->callBoxed(stack);
  TORCH_INTERNAL_ASSERT(stack.size() == 1 && stack[0].isTensor());
  return std::move(stack[0]).toTensor();
}

} // namespace torchattn::kernels::cpu

#include "onednn_linear.h"

#include "linear.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/Exception.h>

#include <optional>
#include <vector>

namespace torchattn::kernels::cpu {

namespace {

// The operator, looked up once; none where LibTorch was built without oneDNN.
const std::optional<c10::OperatorHandle>& linear_pointwise() {
  static const std::optional<c10::OperatorHandle> op = []() -> std::optional<c10::OperatorHandle> {
    auto handle = c10::Dispatcher::singleton().findSchema({"mkldnn::_linear_pointwise", ""});
    if (!handle || !handle->hasKernelForDispatchKey(c10::DispatchKey::CPU)) return std::nullopt;
    return handle;
  }();
  return op;
}

} // namespace

bool onednn_linear_applies(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return linear_pointwise().has_value() && plain_linear_rows(x, weight, bias) > kSmallLinearRows;
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

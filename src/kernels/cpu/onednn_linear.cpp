#include "kernels/cpu/onednn_linear.h"

#include "kernels/cpu/linear.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/Exception.h>

#include <optional>
#include <vector>

namespace torchattn::kernels::cpu {

namespace {

// A LibTorch operator with a CPU kernel, or none where LibTorch was built without it
// (these are oneDNN's).
std::optional<c10::OperatorHandle> find_cpu_operator(const char* name) {
  auto handle = c10::Dispatcher::singleton().findSchema({name, ""});
  if (!handle || !handle->hasKernelForDispatchKey(c10::DispatchKey::CPU)) return std::nullopt;
  return handle;
}

// Looked up once.
const std::optional<c10::OperatorHandle>& linear_pointwise() {
  static const std::optional<c10::OperatorHandle> op = find_cpu_operator("mkldnn::_linear_pointwise");
  return op;
}

const std::optional<c10::OperatorHandle>& reorder_linear_weight() {
  static const std::optional<c10::OperatorHandle> op = find_cpu_operator("mkldnn::_reorder_linear_weight");
  return op;
}

// mkldnn::_linear_pointwise(Tensor X, Tensor W, Tensor? B, str attr, Scalar?[] scalars, str? algorithm)
at::Tensor call_linear_pointwise(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
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

}  // namespace

bool onednn_available() { return linear_pointwise().has_value() && reorder_linear_weight().has_value(); }

at::Tensor onednn_pack_weight(const at::Tensor& weight) {
  TORCH_CHECK(onednn_available(), "onednn_pack_weight: this LibTorch has no oneDNN linear operators");
  TORCH_CHECK(weight.is_cpu() && weight.scalar_type() == at::kFloat && weight.dim() == 2 && weight.is_contiguous(),
              "onednn_pack_weight: expected a dense float32 CPU weight [out, in], got ", weight.sizes(), " of ",
              weight.scalar_type(), " on ", weight.device());
  // mkldnn::_reorder_linear_weight(Tensor self, int? batch_size=None)
  torch::jit::Stack stack;
  stack.emplace_back(weight);
  stack.emplace_back(c10::IValue());
  reorder_linear_weight()->callBoxed(stack);
  TORCH_INTERNAL_ASSERT(stack.size() == 1 && stack[0].isTensor());
  return std::move(stack[0]).toTensor();
}

at::Tensor onednn_linear_packed(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& bias) {
  TORCH_CHECK(onednn_available() && packed.is_mkldnn() && packed.dim() == 2,
              "onednn_linear_packed: expected a weight from onednn_pack_weight");
  TORCH_CHECK(x.is_cpu() && x.scalar_type() == at::kFloat && x.dim() >= 1 && x.size(-1) == packed.size(1),
              "onednn_linear_packed: expected float32 CPU x [..., ", packed.size(1), "], got ", x.sizes(), " of ",
              x.scalar_type());
  return call_linear_pointwise(x, packed, bias);
}

bool onednn_linear_applies(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return linear_pointwise().has_value() && plain_linear_rows(x, weight, bias) > kSmallLinearRows;
}

at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  TORCH_CHECK(onednn_linear_applies(x, weight, bias),
              "onednn_linear: expected float32 CPU rows, a dense weight and no gradient");
  return call_linear_pointwise(x, weight, bias);
}

}  // namespace torchattn::kernels::cpu

#include "kernels/cpu/dynamic_int8_linear.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <ATen/ops/all.h>
#include <ATen/ops/aminmax.h>
#include <ATen/ops/div.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/minimum.h>
#include <ATen/ops/quantize_per_tensor.h>
#include <ATen/ops/scalar_tensor.h>
#include <c10/util/Exception.h>

#include <limits>
#include <optional>
#include <utility>

namespace torchattn::kernels::cpu {

struct DynamicInt8Weight {
  c10::IValue packed;  // LinearPackedParamsBase, from quantized::linear_prepack
  double scale = 1.0;
  int64_t in = 0;
  int64_t bytes = 0;
};

namespace {

std::optional<c10::OperatorHandle> find_quantized_operator(const char* name) {
  return c10::Dispatcher::singleton().findSchema({name, ""});
}

const std::optional<c10::OperatorHandle>& linear_prepack() {
  static const std::optional<c10::OperatorHandle> op = find_quantized_operator("quantized::linear_prepack");
  return op;
}

const std::optional<c10::OperatorHandle>& linear_dynamic() {
  static const std::optional<c10::OperatorHandle> op = find_quantized_operator("quantized::linear_dynamic");
  return op;
}

// MinMaxObserver(dtype=qint8, qscheme=per_tensor_symmetric)'s scale, in its float32
// tensor arithmetic: max(-min(w_min, 0), max(w_max, 0)) / ((127 - -128) / 2), at least
// float32 epsilon.
double symmetric_scale(const at::Tensor& weight) {
  auto [lo, hi] = at::aminmax(weight);
  const at::Tensor zero = at::scalar_tensor(0.0, weight.options());
  const at::Tensor largest = at::maximum(at::minimum(lo, zero).neg(), at::maximum(hi, zero));
  const at::Tensor scale = at::maximum(largest.div(127.5),
                                       at::scalar_tensor(std::numeric_limits<float>::epsilon(), weight.options()));
  return static_cast<double>(scale.item<float>());
}

}  // namespace

bool dynamic_int8_available() { return linear_prepack().has_value() && linear_dynamic().has_value(); }

std::shared_ptr<const DynamicInt8Weight> dynamic_int8_pack(const at::Tensor& weight, const at::Tensor& bias) {
  TORCH_CHECK(dynamic_int8_available(), "dynamic_int8_pack: this LibTorch registers no quantized::linear_prepack ",
              "and quantized::linear_dynamic operators");
  TORCH_CHECK(weight.is_cpu() && weight.scalar_type() == at::kFloat && weight.dim() == 2 && weight.numel() > 0,
              "dynamic_int8_pack: expected a float32 CPU weight [out, in], got ", weight.sizes(), " of ",
              weight.scalar_type(), " on ", weight.device());
  TORCH_CHECK(!bias.defined() || (bias.is_cpu() && bias.scalar_type() == at::kFloat && bias.dim() == 1 &&
                                  bias.size(0) == weight.size(0)),
              "dynamic_int8_pack: expected a float32 CPU bias [", weight.size(0), "] or none, got ", bias.sizes(),
              " of ", bias.scalar_type());
  const at::Tensor w = weight.detach().contiguous();
  TORCH_CHECK(w.isfinite().all().item<bool>(), "dynamic_int8_pack: expected finite weights, got a NaN or infinity");
  auto packed = std::make_shared<DynamicInt8Weight>();
  packed->scale = symmetric_scale(w);
  const at::Tensor q = at::quantize_per_tensor(w, packed->scale, 0, at::kQInt8);
  packed->in = w.size(1);
  packed->bytes = w.numel() + (bias.defined() ? bias.numel() * static_cast<int64_t>(sizeof(float)) : 0);
  // quantized::linear_prepack(Tensor W, Tensor? B=None) -> LinearPackedParamsBase
  torch::jit::Stack stack;
  stack.emplace_back(q);
  stack.emplace_back(bias.defined() ? c10::IValue(bias.detach().contiguous()) : c10::IValue());
  linear_prepack()->callBoxed(stack);
  TORCH_INTERNAL_ASSERT(stack.size() == 1);
  packed->packed = std::move(stack[0]);
  return packed;
}

at::Tensor dynamic_int8_linear(const at::Tensor& x, const DynamicInt8Weight& weight) {
  TORCH_CHECK(x.is_cpu() && x.scalar_type() == at::kFloat && x.dim() >= 1 && x.size(-1) == weight.in,
              "dynamic_int8_linear: expected float32 CPU x [..., ", weight.in, "], got ", x.sizes(), " of ",
              x.scalar_type(), " on ", x.device());
  if (x.dim() == 1) return dynamic_int8_linear(x.unsqueeze(0), weight).squeeze(0);  // the operator wants rows
  // quantized::linear_dynamic(Tensor X, LinearPackedParamsBase W_prepack, bool reduce_range=False) -> Tensor
  torch::jit::Stack stack;
  stack.reserve(3);
  stack.emplace_back(x.contiguous());
  stack.emplace_back(weight.packed);
  stack.emplace_back(true);
  linear_dynamic()->callBoxed(stack);
  TORCH_INTERNAL_ASSERT(stack.size() == 1 && stack[0].isTensor());
  return std::move(stack[0]).toTensor();
}

double dynamic_int8_scale(const DynamicInt8Weight& weight) { return weight.scale; }

int64_t dynamic_int8_bytes(const DynamicInt8Weight& weight) { return weight.bytes; }

}  // namespace torchattn::kernels::cpu

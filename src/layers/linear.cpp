#include "layers/linear.h"


#include "kernels/cpu/linear.h"
#include "kernels/cpu/onednn_linear.h"

#include <ATen/ops/linear.h>

namespace torchattn::layers {

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (kernels::cpu::small_linear_applies(x, weight, bias)) {
    return kernels::cpu::small_linear(x, weight, bias);
  }
  if (kernels::cpu::onednn_linear_applies(x, weight, bias)) {
    return kernels::cpu::onednn_linear(x, weight, bias);
  }
  return at::linear(x, weight, bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt);
}

}  // namespace torchattn::layers

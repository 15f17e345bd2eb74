#pragma once

// PyTorch's dynamic quantization of a linear layer (torch.ao.quantization.quantize_dynamic
// with its default qconfig), through the operators LibTorch's CPU library registers for
// it (`quantized::linear_prepack`, `quantized::linear_dynamic`; the quantized engine the
// process has chosen, x86/fbgemm by default on x86), called through the dispatcher:
// - the weight: qint8, one scale for the whole tensor, symmetric (MinMaxObserver,
//   per_tensor_symmetric): scale = max(max |w| / 127.5, float32 epsilon), zero point 0;
// - the input: quint8, one scale and zero point per call from its min and max, over 7
//   bits (reduce_range, as nn.quantized.dynamic.Linear asks);
// - int32 sums, scaled back to float32, plus the float32 bias.
// The same operands give PyTorch's numbers bit for bit. A row's output depends on the
// other rows of its call (they share the input's scale).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

namespace torchattn::kernels::cpu {

/// One layer's prepacked weight and bias (opaque: the engine's own packed form).
struct DynamicInt8Weight;

/// Whether this LibTorch registers the quantized linear operators (its CPU builds do).
bool dynamic_int8_available();

/// weight: dense float32 CPU [out, in]; bias: float32 [out] or undefined -> the layer
/// quantized and prepacked as quantize_dynamic does. Requires dynamic_int8_available.
std::shared_ptr<const DynamicInt8Weight> dynamic_int8_pack(const at::Tensor& weight, const at::Tensor& bias);

/// x: float32 CPU [..., in] (no gradient) -> [..., out]: quantized::linear_dynamic.
at::Tensor dynamic_int8_linear(const at::Tensor& x, const DynamicInt8Weight& weight);

/// The layer's weight scale.
double dynamic_int8_scale(const DynamicInt8Weight& weight);

/// Bytes the layer keeps: its int8 weight and float32 bias (the engine's packing aside).
int64_t dynamic_int8_bytes(const DynamicInt8Weight& weight);

}  // namespace torchattn::kernels::cpu

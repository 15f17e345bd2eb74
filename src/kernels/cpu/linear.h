#pragma once

// x W^T + b for a few rows of x on the CPU: the matrix-vector products of decoding,
// which only stream the weights from memory. LibTorch's BLAS runs these on one thread
// (it does not split small products); this kernel splits the output features over all
// intra-op threads, reading each weight row once for every row of x.

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>

namespace torchattn::kernels::cpu {

/// The most rows of x the kernel takes; more go to at::linear (a GEMM's work).
inline constexpr int64_t kSmallLinearRows = 8;

/// The rows of x when x, weight and bias are plain operands of x W^T + b that no
/// gradient flows through: float32 CPU, strided and not nested; weight a dense [out, in]
/// and bias a dense [out] (or undefined); x [..., in]; no gradient to compute, backward
/// (grad mode and requires_grad) or forward (a tangent on any of them). -1 otherwise.
/// The kernels below (and onednn_linear) apply only to such operands.
int64_t plain_linear_rows(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

/// Whether small_linear applies: CPU float32, x of at most kSmallLinearRows rows, dense
/// weight [out, in] (and bias [out]), and no gradient to compute.
bool small_linear_applies(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

/// x: [..., in], weight: [out, in], bias: [out] or undefined -> [..., out]; requires
/// small_linear_applies. Sums in a different order than BLAS: equal to at::linear
/// within float32 rounding, not bit for bit.
at::Tensor small_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

/// The same for several layers that read x (an attention's q, k and v; an MLP's gate and
/// up; each small_linear_applies) -> [..., sum of out_i], each layer's outputs side by
/// side in order, the same bits as small_linear of that layer alone: one parallel region
/// over every layer's outputs. weights and biases one per layer (a bias may be undefined).
at::Tensor small_linear(const at::Tensor& x, at::ArrayRef<at::Tensor> weights, at::ArrayRef<at::Tensor> biases);

}  // namespace torchattn::kernels::cpu

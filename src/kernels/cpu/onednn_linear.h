#pragma once

// x W^T + b through oneDNN, as LibTorch exposes it: the `mkldnn::_linear_pointwise`
// operator (registered by LibTorch's CPU library where it is built with oneDNN, as the
// x86 wheels are), called through the dispatcher with the dense weight as it is (no
// packed copy). On the AMD and Intel CPUs measured it runs the float32 GEMMs of a
// prefill (hundreds of rows) about 8% faster than at::linear's MKL sgemm.

#include <ATen/core/Tensor.h>

namespace torchattn::kernels::cpu {

/// Whether onednn_linear applies: LibTorch has the operator, CPU float32, x of more
/// than a few rows (kSmallLinearRows), dense weight [out, in] (and bias [out]), and no
/// gradient to compute (the operator has no autograd).
bool onednn_linear_applies(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

/// x: [..., in], weight: [out, in], bias: [out] or undefined -> [..., out]; requires
/// onednn_linear_applies. Equal to at::linear within float32 rounding (another
/// blocking of the sums), not bit for bit.
at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

/// Whether LibTorch has oneDNN's linear operators on the CPU (its x86 builds).
bool onednn_available();

/// weight: a dense float32 CPU [out, in] -> the same values in oneDNN's blocked layout
/// (an MKLDNN tensor, `mkldnn::_reorder_linear_weight`), for onednn_linear_packed.
/// Requires onednn_available.
at::Tensor onednn_pack_weight(const at::Tensor& weight);

/// x: float32 CPU [..., in] (no gradient), packed: from onednn_pack_weight [out, in],
/// bias: dense float32 [out] or undefined -> [..., out]. Each row's sums run in the same
/// order whatever the number of rows: a row gives the same bits alone or in a batch.
at::Tensor onednn_linear_packed(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& bias);

}  // namespace torchattn::kernels::cpu

#pragma once

// x W^T + b on the CPU with W stored in fewer bytes than float32: bfloat16, or int8
// with one float32 scale per output feature (W[o, :] ~ scale[o] * q[o, :]). x, b and y
// stay float32 and every sum is float32: what a weight costs is read as 2 or 1 bytes
// and widened to float exactly, so the products differ from float32 weights only by
// the weights' own rounding.
//
//   y[..., o] = dot(x[..., :], float(q[o, :])) * scale[o] + b[o]   (int8)
//   y[..., o] = dot(x[..., :], float(w[o, :])) + b[o]              (bfloat16)
//
// A few rows (decoding; up to kQuantizedMatvecRows) stream the weights once, split
// over the intra-op threads, each row widened into a buffer and dotted with every row
// of x (vec.h's dot). More rows (prefill) widen the weights a tile of output features
// at a time and multiply the tile with a float32 GEMM (oneDNN where LibTorch has it).

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace torchattn::kernels::cpu {

/// The most rows of x the matrix-vector kernel takes; more go through tiles and a GEMM.
inline constexpr int64_t kQuantizedMatvecRows = 16;

/// weight: float32 [out, in] (any device) -> {q, scale}: q int8 [out, in] =
/// round(weight / scale[:, None]) (ties to even) clamped to [-127, 127], scale float32
/// [out] = max |weight[o, :]| / 127 (a row of zeros: scale 0, q 0). A non-finite
/// weight is an error naming the row.
std::pair<at::Tensor, at::Tensor> quantize_int8_rows(const at::Tensor& weight);

/// Whether quantized_linear computes for these operands: x float32 CPU [..., in] with
/// no gradient to compute; data a dense CPU [out, in] of bfloat16 (scale undefined) or
/// int8 (scale float32 dense [out]); bias undefined or float32 dense [out].
bool quantized_linear_applies(const at::Tensor& x, const at::Tensor& data, const at::Tensor& scale,
                              const at::Tensor& bias);

/// x: [..., in] -> [..., out] as above; requires quantized_linear_applies (an error
/// names what differs). Equal to at::linear(x, float(data)) * scale + bias within float32
/// rounding.
at::Tensor quantized_linear(const at::Tensor& x, const at::Tensor& data, const at::Tensor& scale,
                            const at::Tensor& bias);

/// The rows `ids` (int64, any shape [...]) of data [out, in] as float32 [..., in], each
/// times its scale (int8) : an embedding table stored like a linear layer's weight.
at::Tensor dequantized_rows(const at::Tensor& data, const at::Tensor& scale, const at::Tensor& ids);

}  // namespace torchattn::kernels::cpu

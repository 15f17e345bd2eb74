#pragma once

// x W^T + b on the CPU with W stored in fewer bytes than float32: bfloat16, or int8
// with one float32 scale per group of kInt8Group inputs of each output feature
// (W[o, i] ~ scale[o, i / 64] * q[o, i]). x, b and y stay float32 and every sum is
// float32: a weight is read as 2 or 1 bytes and widened to float exactly, so the
// products differ from float32 weights by the weights' own rounding.
//
//   y[..., o] = sum_g scale[o, g] * dot(x[..., g], float(q[o, g])) + b[o]   (int8)
//   y[..., o] = dot(x[..., :], float(w[o, :])) + b[o]                       (bfloat16)
//
// A few rows (decoding; up to kQuantizedMatvecRows) stream the weights once, split
// over the intra-op threads, widened in registers: bfloat16 against one row of x one
// weight row at a time (one stream for the hardware prefetchers), else four weight
// rows at a time with software prefetches, dotted with one row of x or four. More rows (prefill) widen the
// weights a tile of output features at a time and multiply the tile with a float32
// GEMM (oneDNN where LibTorch has it); or, for int8 weights on a CPU with AVX-512
// VNNI, quantize x per group too and sum int8 products where the caller asks, in
// decoding as in prefill (Int8Products; int8_products.h).

#include <torchattn/weight_format.h>

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>

namespace torchattn::kernels::cpu {

/// The most rows of x the matrix-vector kernel takes; more go through tiles and a GEMM.
inline constexpr int64_t kQuantizedMatvecRows = 16;

/// The inputs that share an int8 scale (as llama.cpp's Q8_0 groups of 32, CTranslate2's
/// rows): 64 keeps all-MiniLM-L6-v2's embeddings within cosine 0.999 of float32 (one
/// scale per row does not: 0.9965) for 1.0625 bytes a weight.
inline constexpr int64_t kInt8Group = kInt8GroupSize;

/// Groups of kInt8Group in `in` inputs (the last may be shorter).
int64_t int8_groups(int64_t in);

/// weight: float32 [out, in] (CPU) -> {q, scale}: scale float32 [out, int8_groups(in)] =
/// max |w| over the group / 127, q int8 [out, in] = round(w / its group's scale) (ties
/// to even) clamped to [-127, 127] (a group of zeros: scale 0, q 0). A non-finite
/// weight is an error naming the row.
std::pair<at::Tensor, at::Tensor> quantize_int8_groups(const at::Tensor& weight);

/// How quantized_linear multiplies int8 weights by x. Float: x stays float32 (the
/// products above). Int8: x is quantized per group of 64 as well (int8_products.h; the
/// widest kernel this CPU runs, the same numbers with each). Auto: Int8 where
/// int8_products_auto(), else Float. Int4 weights (uint8 data, int4_rows.h) take Int8
/// too: x quantized per group of 32 (int4_rows.h's products), up to
/// kQuantizedMatvecRows rows by the few-rows kernels and past them, on AVX2, by the
/// tiles (products_tiles; elsewhere a prefill widens tiles for a float32 GEMM).
/// bfloat16 weights ignore it.
enum class Int8Products : int8_t { Auto, Float, Int8 };

/// Whether Int8Products::Auto takes the int8 products on this CPU (under the
/// TORCHATTN_ISA cap), for any number of rows: where a kernel of its instruction set
/// measured faster than the float products (AVX-512 VNNI, AVX2), not the portable loop.
bool int8_products_auto();

/// One weight matrix of a product of several that read the same x (quantized_linear's
/// parts): data [out, in] int8 with scale float32 [out, int8_groups(in)], or bfloat16
/// with scale undefined; bias float32 [out] or undefined.
struct QuantizedWeight {
  at::Tensor data, scale, bias;
};

/// Whether quantized_linear computes for these operands: x float32 CPU [..., in] with
/// no gradient to compute; data a dense CPU [out, in] of bfloat16 (scale undefined) or
/// int8 (scale float32 dense [out, int8_groups(in)]); bias undefined or float32 [out].
bool quantized_linear_applies(const at::Tensor& x, const at::Tensor& data, const at::Tensor& scale,
                              const at::Tensor& bias);

/// x: [..., in] -> [..., out] as above; requires quantized_linear_applies (an error
/// names what differs). Float products: equal to at::linear(x, dequantized data, bias)
/// within float32 rounding; Int8 products: int8_products.h's numbers.
at::Tensor quantized_linear(const at::Tensor& x, const at::Tensor& data, const at::Tensor& scale,
                            const at::Tensor& bias, Int8Products products = Int8Products::Auto);

/// Whether quantized_linear computes for x and these parts: each as
/// quantized_linear_applies, all int8 or all bfloat16, one `in`, at least one.
bool quantized_linear_applies(const at::Tensor& x, at::ArrayRef<QuantizedWeight> parts);

/// x: [..., in] -> [..., sum of out_i]: each part's outputs, side by side in order, the
/// same bits as quantized_linear of that part alone, computed together: x quantized
/// once for int8 products, and up to kQuantizedMatvecRows rows one parallel region over
/// every part's outputs (a decoding step's q, k and v; gate and up). Requires
/// quantized_linear_applies(x, parts) (an error names what differs).
at::Tensor quantized_linear(const at::Tensor& x, at::ArrayRef<QuantizedWeight> parts,
                            Int8Products products = Int8Products::Auto);

/// data: int8 [out, in], scale: float32 [out, int8_groups(in)] (CPU), as a file holds
/// them -> the flat index (row * groups + group) of the first scale that
/// quantize_int8_groups cannot make, or -1 when there is none. It makes scales that are
/// finite, in [0, the largest float32 / 127], 0 only over a group whose int8 values are
/// all 0, and any other (a normal float) only over a group whose largest |value| is 127:
/// the scale is the group's largest |weight| / 127, which quantizes to +-127. One pass
/// over the scales and the values (a group of 64 bytes each).
int64_t first_unproducible_scale(const at::Tensor& data, const at::Tensor& scale);
/// Those scales in words, for errors.
inline constexpr const char* kProducibleScales =
    "finite, in [0, 2.68e36] (the largest float32 / 127), 0 only over a group of zero weights, and otherwise over "
    "a group whose largest |value| is 127, where quantization puts each group's largest weight";

/// The rows `ids` (int64, any shape [...]) of data [out, in] as float32 [..., in],
/// dequantized: an embedding table stored like a linear layer's weight. An id outside
/// [0, out) is an error naming it.
at::Tensor dequantized_rows(const at::Tensor& data, const at::Tensor& scale, const at::Tensor& ids);

}  // namespace torchattn::kernels::cpu

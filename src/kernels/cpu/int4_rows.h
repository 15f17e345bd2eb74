#pragma once

// Four-bit weights (WeightFormat::Int4): each group of kInt4Group = 32 inputs of an
// output feature holds 4-bit values q in [0, 15] with a float16 step d and a float16
// offset m, w ~ q d + m: llama.cpp's Q4_1 block, so that a GGUF file's Q4_1 (and its
// Q4_0: m = -8 d) tensors are these bytes without a weight's value changed. 0.625 bytes
// a weight (int8: 1.0625).
//
//   data  uint8   [out, in / 2]: group g of row o is the 16 bytes at [o, 16 g]; byte j
//                 holds input 32 g + j in its low 4 bits and input 32 g + 16 + j in
//                 its high 4 bits (GGUF's order)
//   scale float16 [out, in / 32, 2]: (d, m) of each group
//
// Quantization of a group w[0, 32) (quantize_int4_groups, PyTorch's float32 and
// float16 roundings: tests/reference/make_golden.py):
//   lo = min w, hi = max w;  d = half((hi - lo) / 15), m = half(lo)   (to nearest, ties to even)
//   q = clamp(round((w - float(m)) / float(d)), 0, 15)  (ties to even; 0 where d is 0)
//
// The products (quantized_linear.h), with sx[g] the sum of x over group g:
//   y[o] = sum_g float(d[o, g]) * dot(x[g], q[o, g]) + float(m[o, g]) * sx[g]
// equal to x times the dequantized weights (q d + m, exact in float32 before the sum)
// within float32 rounding.

#include <torchattn/detail/kernels/cpu/cpu_features.h>
#include <torchattn/weight_format.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>

namespace torchattn::kernels::cpu {

/// Inputs per (d, m) pair of WeightFormat::Int4.
inline constexpr int64_t kInt4Group = kInt4GroupSize;

/// weight: float32 [out, in] (CPU), in a multiple of kInt4Group -> {data, scale} as
/// above. An error names the row of a non-finite weight, or of a group whose d or m
/// float16 cannot hold (|w| or the group's range past 65504).
std::pair<at::Tensor, at::Tensor> quantize_int4_groups(const at::Tensor& weight);
/// quantize_int4_groups() with the instructions of `isa` (one of supported_isas()): the
/// same bits on every one (tests).
std::pair<at::Tensor, at::Tensor> quantize_int4_groups(const at::Tensor& weight, Isa isa);

/// Whether data, scale are int4 weights as above: uint8 [out, in / 2] and float16
/// [out, in / 32, 2], dense CPU, in a multiple of 32.
bool int4_weights(const at::Tensor& data, const at::Tensor& scale);

/// The flat index (row * groups + group) of the first (d, m) pair that is not finite,
/// or -1: a file's int4 weights are checked with it before they are used.
int64_t first_non_finite_int4_scale(const at::Tensor& scale);

namespace int4 {

// Rows [begin, end) of int4 weights (data, scale pointers of row 0; `in` inputs)
// dequantized into out ([end - begin, in] floats): q d + m, each one float32 FMA (exact).
void dequantize_rows(const uint8_t* q, const uint16_t* dm, int64_t in, int64_t begin, int64_t end, float* out);

// y[r * ldy + o] = sum as above (+ bias[o] where bias is not null) for outputs
// [begin, end) and the `rows` rows of x ([rows, in] contiguous), sx [rows, in / 32]
// the sums of x over each group (group_sums): four weight rows at a time against
// each row of x, each group's 32 products in vector registers, folded by its d.
void dot_rows(const uint8_t* q, const uint16_t* dm, int64_t in, int64_t begin, int64_t end, const float* xs,
              const float* sx, int64_t rows, const float* bias, float* y, int64_t ldy);

// sx[r * groups + g] = the sum of x[r, 32 g .. 32 g + 32) (float32, in order).
void group_sums(const float* xs, int64_t rows, int64_t in, float* sx);

// The int8 products (Int8Products, as int8 weights take them: llama.cpp's q4_1 x q8_1):
// each row's groups of 32 inputs quantized symmetrically,
//   s[r, g] = max |x[r, group g]| / 127 (NaN where the group holds a NaN or inf),
//   qx[r, i] = round(x[r, i] / s[r, g]) in [-127, 127], ties to even (0 where s is 0 or NaN),
// and each weight row's groups summed in int32 (exact: at most 32 * 15 * 127):
//   sq[r, g] = s[r, g] * sum_{i in g} qx[r, i] (float32: x's sum as quantized),
//   y[r, o] = sum_g float(d[o, g]) s[r, g] sum_{i in g} q[o, i] qx[r, i] + float(m[o, g]) sq[r, g]
// in float32, within float32 rounding of that sum (the AVX2 kernel sums two groups'
// products in four int32 lanes each and scales them in a vector register; the portable
// loop a group at a time). AVX2's vpmaddubsw multiplies the weights' unsigned 4-bit
// values by x's signed bytes directly (no sign trick: the values are non-negative), 64
// products in five instructions. quantize_inputs writes qx [rows, in] and sp [rows,
// in / 32, 2]: each group's (s, sq) pair.
void quantize_inputs(const float* xs, int64_t rows, int64_t in, int8_t* qx, float* sp);
// As dot_rows with the products above, by the kernel of `isa` (AVX2 and wider: AVX2's;
// else the portable loop).
void dot_rows_products(Isa isa, const uint8_t* q, const uint16_t* dm, int64_t in, int64_t begin, int64_t end,
                       const int8_t* qx, const float* sp, int64_t rows, const float* bias, float* y, int64_t ldy);

// More rows (a prefill), with the same products: every output [0, out) of the weights
// for the `rows` rows of qx and sp (quantize_inputs'), y[r * ldy + o] (+ bias[o]), over
// the intra-op threads (int4_tiles.cpp): a panel of 16 outputs at a time repacked to
// bytes, tiles of 4 rows of x over it, each group's int8 products summed exactly and
// scaled as above in float32. products_tiles_apply(isa): whether a prefill takes them
// under `isa` (AVX2; AVX-512 not yet measured); else it widens the weights for a
// float32 GEMM.
bool products_tiles_apply(Isa isa);
void products_tiles(Isa isa, const uint8_t* q, const uint16_t* dm, int64_t out, int64_t in, const int8_t* qx,
                    const float* sp, int64_t rows, const float* bias, float* y, int64_t ldy);

}  // namespace int4

}  // namespace torchattn::kernels::cpu

#pragma once

// x W^T + b with int8 products: the rows of x quantized like the int8 weights, a
// symmetric scale per group of kInt8Group inputs of each row, and every group's
// products summed in int32 (exact), then scaled in float32. The path of int8
// weights on x86 CPUs, in prefill and in decoding (llama.cpp's q8_0 x q8_0,
// CTranslate2's int8 GEMM): with AVX-512 VNNI four times the products of a float32 FMA
// per instruction, with AVX2 alone twice (quantized_linear.cpp says where each pays).
//
//   sx[m, g] = max |x[m, group g]| / 127         (NaN where the group holds a NaN or inf)
//   qx[m, i] = round(x[m, i] / sx[m, g]) in [-127, 127], ties to even (0 where sx is 0)
//   d[m, o, g] = sum_{i in group g} qx[m, i] * q[o, i]                    (int32, exact)
//   acc = 0; for g in order: acc = fma(float(d[m, o, g]) * scale[o, g], sx[m, g], acc)
//   y[m, o] = acc + b[o]
//
// Every rounding step is named above, so the AVX-512 VNNI kernels, the AVX2 kernels and
// the portable loop give the same bits, whatever the number of rows.
//
// The kernels (int8_tiles.cpp) are written once over simd.h's integer registers and
// entered through run_on; what differs between the instruction sets is how x's bytes
// meet the weights:
// - AVX2 (no VNNI): vpmaddubsw multiplies unsigned bytes by signed ones into int16
//   pairs, so the bytes go in as |qx| against the weights given qx's sign (vpsignb:
//   products and sums unchanged, each pair at most 2 * 127 * 127, inside int16), and
//   vpmaddwd sums the pairs into int32 lanes of four products, the same 4-byte groups as
//   VNNI's. Four vector instructions per 32 products where VNNI needs one per 64, but
//   twice the products per instruction of a float32 FMA.
// - AVX-512 VNNI: x goes in as unsigned bytes qx + 128 with 128 * sum(q) taken back.
// Up to 16 rows (decoding) the weights are read in place, four groups of 64 of an output
// summed across their registers together (one row of x: one stream of weight rows with
// VNNI, four side by side with AVX2; more rows: four outputs at a time); more rows
// repack the weights a panel of two registers of outputs at a time into 4-byte groups
// (one output a lane, no sum across). A group of inputs that holds a NaN or an infinity
// gives NaN outputs, never a silent number.

#include <torchattn/detail/kernels/cpu/cpu_features.h>
#include "kernels/cpu/quantized_linear.h"

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <vector>

namespace torchattn::kernels::cpu {

/// The kernel each instruction set runs: Scalar the portable loop; Avx2 and Avx512
/// AVX2's vpmaddubsw (no int8 kernel is written for AVX-512 without VNNI); Avx512Vnni
/// VNNI's vpdpbusd. "portable", "avx2" or "vnni" (tests, benchmarks).
const char* int8_kernel_name(Isa isa);

/// x float32 [rows, in] contiguous (CPU), q int8 [out, in] contiguous, scale float32
/// [out, int8_groups(in)], bias float32 [out] or undefined -> y float32 [rows, out] as
/// above, by the kernel of `isa` (one of supported_isas(); a wider one is an error
/// naming it, check_isa_at_most); the same numbers with every kernel. The caller has
/// checked the operands (quantized_linear_applies).
at::Tensor int8_products_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale,
                                const at::Tensor& bias, Isa isa);

/// The same for several weight matrices (int8 QuantizedWeight parts of one `in`) ->
/// y [rows, sum of out_i], each part's columns in order, the same bits as each alone:
/// x quantized once; up to 16 rows one parallel region over every part's outputs, more
/// rows each part's panels in turn.
at::Tensor int8_products_linear(const at::Tensor& x, at::ArrayRef<QuantizedWeight> parts, Isa isa);

}  // namespace torchattn::kernels::cpu

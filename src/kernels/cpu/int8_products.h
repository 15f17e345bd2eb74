#pragma once

// x W^T + b with int8 products: the rows of x quantized like the int8 weights, a
// symmetric scale per group of kInt8Group inputs of each row, and every group's
// products summed in int32 (exact), then scaled in float32. The path of int8
// weights on CPUs with AVX-512 VNNI, in prefill and in decoding (llama.cpp's q8_0 x
// q8_0, CTranslate2's int8 GEMM): four times the products of a float32 FMA per
// instruction.
//
//   sx[m, g] = max |x[m, group g]| / 127         (NaN where the group holds a NaN or inf)
//   qx[m, i] = round(x[m, i] / sx[m, g]) in [-127, 127], ties to even (0 where sx is 0)
//   d[m, o, g] = sum_{i in group g} qx[m, i] * q[o, i]                    (int32, exact)
//   acc = 0; for g in order: acc = fma(float(d[m, o, g]) * scale[o, g], sx[m, g], acc)
//   y[m, o] = acc + b[o]
//
// Every rounding step is named above, so the AVX-512 VNNI kernels and the portable
// loop give the same bits, whatever the number of rows. x goes in as unsigned bytes
// qx + 128 with 128 * sum(q) taken back. Up to 16 rows (decoding) the weights are read
// in place, a group of 64 of an output in one register, the int32 sums of four such
// registers added across them together (one row of x: four groups of one output;
// more: four outputs); more rows repack the weights a panel of 32 outputs at a time
// into VNNI's 4-byte groups (one output a lane, no sum across). A group of inputs that
// holds a NaN or an infinity gives NaN outputs, never a silent number.

#include <ATen/core/Tensor.h>

namespace torchattn::kernels::cpu {

/// Whether this CPU runs the AVX-512 VNNI kernel (AVX-512F, BW and VNNI; read once).
bool int8_products_vnni();

/// x float32 [rows, in] contiguous (CPU), q int8 [out, in] contiguous, scale float32
/// [out, int8_groups(in)], bias float32 [out] or undefined -> y float32 [rows, out] as
/// above. vnni: the AVX-512 VNNI kernel (requires int8_products_vnni()), else the
/// portable loop; the same numbers either way. The caller has checked the operands
/// (quantized_linear_applies).
at::Tensor int8_products_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale,
                                const at::Tensor& bias, bool vnni);

}  // namespace torchattn::kernels::cpu

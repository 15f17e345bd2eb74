#pragma once

// float32 vector primitives of the CPU kernels (decode_attention, small_linear), on
// the vector types of simd.h: AVX2 with FMA where the CPU has it, a scalar loop
// elsewhere. AVX-512 would add the products of dot in another order (other bits), so
// these stop at AVX2.

#include "kernels/cpu/cpu_features.h"

#include <cstdint>

namespace torchattn::kernels::cpu {

/// The instruction set dot() and axpy() take by default: best_isa(), at most Avx2.
Isa vec_isa();

/// sum_i a[i] * b[i] over n floats. AVX2: four accumulators of 8 lanes over blocks of
/// 32 (FMA), then one over the blocks of 8 left, added (a0 + a1) + (a2 + a3) and
/// across lanes (Avx2::reduce_add_adjacent), then the last n % 8 products in order, as
/// the compiler makes `total += a[i] * b[i]` for an FMA target (GCC: with 4 or more,
/// 4 products rounded before their adds, the rest fused). Scalar: the products in
/// order from i = 0 (multiply, then add).
float dot(const float* a, const float* b, int64_t n);
/// dot() with the instructions of `isa`: one of supported_isas(), at most vec_isa()
/// (tests).
float dot(const float* a, const float* b, int64_t n, Isa isa);

/// y[i] += alpha * x[i] over n floats (AVX2: one FMA each, the tail's contracted by the
/// compiler; Scalar: multiply, then add).
void axpy(float alpha, const float* x, float* y, int64_t n);
/// axpy() with the instructions of `isa`, as for dot (tests).
void axpy(float alpha, const float* x, float* y, int64_t n, Isa isa);

}  // namespace torchattn::kernels::cpu

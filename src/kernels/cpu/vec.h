#pragma once

// float32 vector primitives of the CPU kernels (decode_attention, small_linear),
// written once on the vector types of simd.h and run with the widest instructions the
// CPU has (best_isa()), but for matvec, whose widest is AVX2 (kMatvecWidest).

#include <torchattn/detail/kernels/cpu/cpu_features.h>

#include <cstdint>

namespace torchattn::kernels::cpu {

/// The widest instructions matvec() runs (a CPU with AVX-512 runs AVX2's there): it
/// reads memory-bound rows of weights, and 16 lanes read them no faster. A 1B model's
/// shapes, 4 matrices in turn, 2 threads, medians of 3 interleaved rounds, an AMD EPYC
/// Zen 5 (AVX-512): 2048 x 8192 1.325 ms with AVX-512 against 1.260 with AVX2, 8192 x
/// 2048 1.283 against 1.252 (SmolLM2-135M's 576 x 1536, in cache: 0.023 against 0.025).
inline constexpr Isa kMatvecWidest = Isa::Avx2;

/// sum_i a[i] * b[i] over n floats. With W lanes (AVX2 8, AVX-512 16): four
/// accumulators over blocks of 4W (FMA), then one over the blocks of W left, added
/// (a0 + a1) + (a2 + a3) and across lanes (reduce_add_adjacent: 16 lanes folded to 8,
/// then 8 to 4, then adjacent pairs), then the last n % W products in order, as the
/// compiler makes `total += a[i] * b[i]` for an FMA target (GCC: with 4 or more, 4
/// products rounded before their adds, the rest fused). Scalar: the products in order
/// from i = 0 (multiply, then add).
float dot(const float* a, const float* b, int64_t n);
/// dot() with the instructions of `isa`: one of supported_isas() (tests).
float dot(const float* a, const float* b, int64_t n, Isa isa);

/// y[i] += alpha * x[i] over n floats (vectors: one FMA each, the tail fused as well, by
/// std::fma; Scalar: multiply, then add).
void axpy(float alpha, const float* x, float* y, int64_t n);
/// axpy() with the instructions of `isa`, as for dot (tests).
void axpy(float alpha, const float* x, float* y, int64_t n, Isa isa);

/// out[j] = dot(a, b + j * stride, n) for j in [0, count): the same bits, one dispatch
/// for all (decode_attention's scores of one query row over its keys).
void dots(const float* a, const float* b, int64_t stride, int64_t count, int64_t n, float* out);
/// out[j] = sum_i w[j * n + i] * x[i] for j in [0, count): x times the dense rows of w
/// (a linear layer's decoding step, small_linear). Each row, AVX2 (kMatvecWidest): two accumulators of
/// 8 lanes over blocks of 16 (FMA), one more block of 8 into the first, added (a + c)
/// and across lanes (Avx2::reduce_add_adjacent), then the last n % 8 products in order,
/// each fused (std::fma). Scalar: the products in order from i = 0 (multiply, then add).
/// A row's bits do not depend on count, on where the row falls or on the streams below,
/// so a split of the rows over threads changes no result.
///
/// The rows are read as matvec_streams() streams. Four: split in four runs of
/// count / 4, row j of each run summed together, sharing the loads of x (the rest one at
/// a time). Where best_isa() is AVX2 or AVX-512 (every layer's weights of a decoding
/// step, medians of interleaved passes, 2 threads / 1 thread, against one row after
/// another): on an AMD EPYC Zen 3 (AVX2), a 1B model's read at 32.3 against 24.6 GB/s /
/// 19.2 against 15.5, SmolLM2-135M's at 34.5 against 26.0 / 19.0 against 13.9; on an
/// AMD EPYC Zen 5 (AVX-512, the AVX2 instructions of kMatvecWidest), the 1B's at 62.2 and
/// 52.3 against 56.9 and 47.5 (two runs) / 38.2 against 34.4, SmolLM2-135M's at 65.9
/// against 60.3 / 37.9 against 35.4 (not measured on an Intel Xeon). One, every row in
/// turn, with the scalar instructions: four ran slower there (14.7 against 17.7 GB/s
/// for SmolLM2-135M, Zen 5, 2 threads).
void matvec(const float* x, const float* w, int64_t n, int64_t count, float* out);
/// matvec() with the instructions of `isa` (one of supported_isas(); a wider one than
/// kMatvecWidest runs kMatvecWidest's) and 1 or 4 streams (tests).
void matvec(const float* x, const float* w, int64_t n, int64_t count, float* out, Isa isa, int streams);
/// The streams matvec() reads the rows as: 4 where best_isa() is AVX2 or AVX-512, else 1.
int matvec_streams();

/// For j in [0, count) in order, where alpha[j] != 0: axpy(alpha[j], x + j * stride, y,
/// n). The same bits as those calls, one dispatch for all (a softmax's weighted sum of
/// values; a weight of 0 adds nothing and its row is not read).
void axpys(const float* alpha, const float* x, int64_t stride, int64_t count, float* y, int64_t n);

/// out[i] = x[i] as float16 bits over n floats, rounded to the nearest (ties to even),
/// the bits of c10::Half(x[i]) for every value but NaN (a quiet NaN either way):
/// F16C's vcvtps2ph W lanes at a time, the tail (and the Scalar target) by
/// simd::Scalar::narrow_halves.
void narrow_halves(const float* x, int64_t n, uint16_t* out);
/// narrow_halves() with the instructions of `isa` (tests).
void narrow_halves(const float* x, int64_t n, uint16_t* out, Isa isa);

}  // namespace torchattn::kernels::cpu

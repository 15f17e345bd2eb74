#pragma once

// float32 vector primitives of the CPU kernels: AVX2 and FMA where the CPU has them
// (checked once at run time), a scalar loop elsewhere.

#include <cstdint>

namespace torchattn::kernels::cpu {

/// Whether dot() and axpy() take their AVX2 path on this CPU.
bool has_avx2();

/// sum_i a[i] * b[i] over n floats.
float dot(const float* a, const float* b, int64_t n);

/// y[i] += alpha * x[i] over n floats.
void axpy(float alpha, const float* x, float* y, int64_t n);

}  // namespace torchattn::kernels::cpu

#pragma once

// The vector instruction sets the CPU kernels are written for, and which of them this
// CPU runs: the one place that asks the CPU (once, then cached).

#include <cstdint>
#include <vector>

// The vector kernels: x86 with GCC. They are written once over the vector types and
// inlined into one entry point per instruction set (target attributes), which GCC
// allows; clang refuses vector types in the non-target template itself, so a clang
// build (the fuzzing build) runs the scalar kernels.
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__clang__)
#define TORCHATTN_SIMD_X86 1
#endif

namespace torchattn::kernels::cpu {

/// The instruction sets of the vector types in simd.h, narrowest first: Scalar (plain
/// float arithmetic, any CPU), Avx2 (8 float lanes, with FMA), Avx512 (16 lanes,
/// AVX-512F).
enum class Isa : int8_t { Scalar, Avx2, Avx512 };

/// The widest instruction set this CPU runs: Avx512 with AVX-512F, AVX2 and FMA;
/// Avx2 with AVX2 and FMA; else (or off x86) Scalar. Read from the CPU on the first
/// call, then cached.
Isa best_isa();

/// Every instruction set this CPU runs, narrowest first: Scalar .. best_isa().
std::vector<Isa> supported_isas();

/// "scalar", "avx2" or "avx512" (test names, messages).
const char* isa_name(Isa isa);

}  // namespace torchattn::kernels::cpu

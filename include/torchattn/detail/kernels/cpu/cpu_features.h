#pragma once

// The vector instruction sets the CPU kernels are written for, and which of them this
// CPU runs: the one place that asks the CPU (once, then cached).

#include <cstdint>
#include <vector>

// The vector kernels: x86 with GCC or clang. They are written once over the vector
// types and inlined into one entry point per instruction set (target attributes);
// simd.h says what clang needs for that.
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define TORCHATTN_SIMD_X86 1
#endif

namespace torchattn::kernels::cpu {

/// The instruction sets the kernels are written for, narrowest first: Scalar (plain
/// float arithmetic, any CPU), Avx2 (8 float lanes, with FMA), Avx512 (16 lanes,
/// AVX-512F), Avx512Vnni (AVX-512 with BW and VNNI: the int8 products' vpdpbusd). The
/// float kernels' vector types stop at Avx512 (simd.h: run_on takes a wider level as
/// its kernel's widest); the int8 products have a kernel for Avx512Vnni
/// (int8_products.h). AMX is not a level: no kernel is written for it.
enum class Isa : int8_t { Scalar, Avx2, Avx512, Avx512Vnni };

/// The environment variable that caps the instruction set of torchattn's CPU kernels:
/// "scalar", "avx2", "avx512" or "avx512_vnni" (anything else is an error naming it at
/// the first kernel call). With TORCHATTN_ISA=avx2 an AVX-512 machine runs the kernels
/// as an AVX2-only CPU does, and with avx512 as an AVX-512 CPU without VNNI does, so
/// that one machine measures every path.
/// Read once, at the first call; unset or empty: no cap. It narrows only: a cap wider
/// than the CPU changes nothing. (ATen's own kernels follow ATEN_CPU_CAPABILITY and
/// oneDNN's ONEDNN_MAX_CPU_ISA; docs/development.md.)
inline constexpr const char* kIsaCapVariable = "TORCHATTN_ISA";

/// The widest instruction set this CPU runs: Avx512Vnni with AVX-512F, BW and VNNI,
/// AVX2, FMA and F16C; Avx512 with AVX-512F, AVX2, FMA and F16C; Avx2 with AVX2, FMA
/// and F16C (every AVX2 CPU has the last); else (or off x86) Scalar. Read from the CPU on the first call, then cached;
/// ignores the cap.
Isa cpu_isa();

/// The cap that kIsaCapVariable sets, Avx512Vnni (the widest) where it is not set.
Isa isa_cap();

/// The cap a value of kIsaCapVariable sets: Avx512Vnni for null or empty; "scalar",
/// "avx2", "avx512" or "avx512_vnni"; anything else a c10::Error naming the variable,
/// what it takes and `value`.
Isa parse_isa_cap(const char* value);

/// What the kernels use: the narrower of cpu_isa() and isa_cap().
Isa best_isa();

/// Every instruction set the kernels may use, narrowest first: Scalar .. best_isa().
std::vector<Isa> supported_isas();

/// The bytes of memory this machine has (sysconf's physical pages), for the checks that
/// refuse a structure that could never be held; int64's largest where it cannot tell.
int64_t physical_memory_bytes();

/// "scalar", "avx2", "avx512" or "avx512_vnni" (test names, messages, the cap's values).
const char* isa_name(Isa isa);

/// The guard of a kernel entry point that takes an instruction set (tests): `isa` must
/// be at most `widest` (best_isa(), or a kernel's own narrower limit), else a c10::Error
/// "<fn>: expected an instruction set up to <widest>, got <isa>".
void check_isa_at_most(Isa isa, Isa widest, const char* fn);

}  // namespace torchattn::kernels::cpu

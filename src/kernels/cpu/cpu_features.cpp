#include "kernels/cpu/cpu_features.h"

namespace torchattn::kernels::cpu {

namespace {

Isa read_best_isa() {
#if defined(TORCHATTN_SIMD_X86)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2 && __builtin_cpu_supports("avx512f")) return Isa::Avx512;
  if (avx2) return Isa::Avx2;
#endif
  return Isa::Scalar;
}

}  // namespace

Isa best_isa() {
  static const Isa best = read_best_isa();
  return best;
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out{Isa::Scalar};
  if (best_isa() >= Isa::Avx2) out.push_back(Isa::Avx2);
  if (best_isa() >= Isa::Avx512) out.push_back(Isa::Avx512);
  return out;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Avx512:
      return "avx512";
    case Isa::Avx2:
      return "avx2";
    case Isa::Scalar:
      break;
  }
  return "scalar";
}

}  // namespace torchattn::kernels::cpu

#include "kernels/cpu/cpu_features.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>

namespace torchattn::kernels::cpu {

namespace {

Isa read_cpu_isa() {
#if defined(TORCHATTN_SIMD_X86)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2 && __builtin_cpu_supports("avx512f")) return Isa::Avx512;
  if (avx2) return Isa::Avx2;
#endif
  return Isa::Scalar;
}

bool read_cpu_vnni() {
#if defined(TORCHATTN_SIMD_X86)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

}  // namespace

Isa parse_isa_cap(const char* value) {
  if (value == nullptr || *value == '\0') return Isa::Avx512;
  const std::string_view v(value);
  for (const Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    if (v == isa_name(isa)) return isa;
  }
  TORCH_CHECK(false, kIsaCapVariable, ": expected scalar, avx2 or avx512 (the widest instruction set torchattn's ",
              "CPU kernels may use), got '", v, "'");
}

Isa cpu_isa() {
  static const Isa isa = read_cpu_isa();
  return isa;
}

Isa isa_cap() {
  static const Isa cap = parse_isa_cap(std::getenv(kIsaCapVariable));
  return cap;
}

Isa best_isa() {
  static const Isa best = std::min(cpu_isa(), isa_cap());
  return best;
}

bool avx512_vnni() {
  static const bool has = best_isa() == Isa::Avx512 && read_cpu_vnni();
  return has;
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

void check_isa_at_most(Isa isa, Isa widest, const char* fn) {
  TORCH_CHECK(isa <= widest, fn, ": expected an instruction set up to ", isa_name(widest), ", got ", isa_name(isa));
}

}  // namespace torchattn::kernels::cpu

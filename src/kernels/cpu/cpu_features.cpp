#include <torchattn/detail/kernels/cpu/cpu_features.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <string_view>

#include <unistd.h>

#if defined(TORCHATTN_SIMD_X86)
#include <cpuid.h>
#endif

namespace torchattn::kernels::cpu {

namespace {

Isa read_cpu_isa() {
#if defined(TORCHATTN_SIMD_X86)
  __builtin_cpu_init();
  // F16C with AVX2 (simd.h's Avx2 converts float16 with it): every AVX2 CPU has it.
  // (CPUID leaf 1's bit for it: clang 14's __builtin_cpu_supports has no "f16c".)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f");
  if (avx512 && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni")) return Isa::Avx512Vnni;
  if (avx512) return Isa::Avx512;
  if (avx2) return Isa::Avx2;
#endif
  return Isa::Scalar;
}

constexpr Isa kEveryIsa[] = {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Avx512Vnni};

}  // namespace

int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return std::numeric_limits<int64_t>::max();
  return static_cast<int64_t>(pages) * static_cast<int64_t>(page);
}

Isa parse_isa_cap(const char* value) {
  if (value == nullptr || *value == '\0') return Isa::Avx512Vnni;
  const std::string_view v(value);
  for (const Isa isa : kEveryIsa) {
    if (v == isa_name(isa)) return isa;
  }
  TORCH_CHECK(false, kIsaCapVariable,
              ": expected scalar, avx2, avx512 or avx512_vnni (the widest instruction set torchattn's CPU kernels may "
              "use), got '",
              v, "'");
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

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (const Isa isa : kEveryIsa) {
    if (isa <= best_isa()) out.push_back(isa);
  }
  return out;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Avx512Vnni:
      return "avx512_vnni";
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

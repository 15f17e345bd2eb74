// The instruction sets of the CPU kernels (detail/kernels/cpu/cpu_features.h) and the cap
// that TORCHATTN_ISA sets. The cap is read once per process, so the ctest entries
// unit_isa_avx512, unit_isa_avx2 and unit_isa_scalar run these and the kernels' tests again under it
// (tests/CMakeLists.txt).

#include <torchattn/detail/kernels/cpu/cpu_features.h>
#include "kernels/cpu/int8_products.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>

namespace {

namespace kc = torchattn::kernels::cpu;

TEST(IsaCap, TheKernelsUseTheNarrowerOfTheCpuAndTheCap) {
  EXPECT_EQ(kc::isa_cap(), kc::parse_isa_cap(std::getenv(kc::kIsaCapVariable)));
  EXPECT_EQ(kc::best_isa(), std::min(kc::cpu_isa(), kc::isa_cap()));
  const auto isas = kc::supported_isas();
  EXPECT_EQ(isas.front(), kc::Isa::Scalar);
  EXPECT_EQ(isas.back(), kc::best_isa());
  // VNNI is the widest level: the int8 kernels follow the cap as the float ones do.
  const char* want = kc::best_isa() >= kc::Isa::Avx512Vnni ? "vnni"
                     : kc::best_isa() >= kc::Isa::Avx2     ? "avx2"
                                                           : "portable";
  EXPECT_STREQ(kc::int8_kernel_name(kc::best_isa()), want);
  std::printf("[isa] cpu %s, cap %s: kernels %s, int8 %s\n", kc::isa_name(kc::cpu_isa()), kc::isa_name(kc::isa_cap()),
              kc::isa_name(kc::best_isa()), kc::int8_kernel_name(kc::best_isa()));
}

// The values the variable takes; anything else is refused at the first kernel call,
// naming the variable, what it takes and what came.
TEST(IsaCap, TakesTheFourNamesAndRefusesAnythingElse) {
  EXPECT_EQ(kc::parse_isa_cap(nullptr), kc::Isa::Avx512Vnni);
  EXPECT_EQ(kc::parse_isa_cap(""), kc::Isa::Avx512Vnni);
  EXPECT_EQ(kc::parse_isa_cap("scalar"), kc::Isa::Scalar);
  EXPECT_EQ(kc::parse_isa_cap("avx2"), kc::Isa::Avx2);
  EXPECT_EQ(kc::parse_isa_cap("avx512"), kc::Isa::Avx512);
  EXPECT_EQ(kc::parse_isa_cap("avx512_vnni"), kc::Isa::Avx512Vnni);
  for (const char* bad : {"sse9", "AVX2", "avx2 ", "avx512vnni", "amx"}) {
    try {
      (void)kc::parse_isa_cap(bad);
      ADD_FAILURE() << "'" << bad << "' was taken";
    } catch (const c10::Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("TORCHATTN_ISA: expected scalar, avx2, avx512 or avx512_vnni"), std::string::npos) << what;
      EXPECT_NE(what.find("got '" + std::string(bad) + "'"), std::string::npos) << what;
    }
  }
}

}  // namespace

// The SIMD layer of the CPU kernels (detail/kernels/cpu/simd.h, cpu_features.h): the
// instruction set chosen is the widest the CPU's flags allow; every vector type's
// operations give the scalar type's bits lane for lane (exp and tanh within a few
// ulp), its reductions add in their documented order, partial loads and stores touch
// only their lanes; and dot and axpy follow their documented order on every
// instruction set, to the bit (but where dot's tail lets the compiler fuse a product
// into its add or not).

#include "common/expect_error.h"

#include <torchattn/detail/kernels/cpu/cpu_features.h>
#include "kernels/cpu/paged_attention.h"
#include <torchattn/detail/kernels/cpu/simd.h>
#include "kernels/cpu/vec.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace K = torchattn::kernels::cpu;
using K::Isa;

// The CPU's flags as Linux lists them ("flags : fpu vme ... avx2 ..."); empty where
// there is no /proc/cpuinfo.
[[maybe_unused]] std::set<std::string> cpuinfo_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> flags;
    for (std::string w; words >> w;) flags.insert(w);
    return flags;
  }
  return {};
}

TEST(CpuFeatures, TheChosenIsaIsTheWidestTheCpuFlagsAndTheCapAllow) {
  const auto isas = K::supported_isas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.front(), Isa::Scalar);
  EXPECT_EQ(isas.back(), K::best_isa());
  EXPECT_TRUE(std::is_sorted(isas.begin(), isas.end()));
  EXPECT_EQ(isas.size(), static_cast<size_t>(K::best_isa()) + 1);
  EXPECT_EQ(K::paged_isas(), isas);
#if defined(TORCHATTN_SIMD_X86)
  const auto flags = cpuinfo_flags();
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo to compare with";
  const bool avx2 = flags.count("avx2") && flags.count("fma");
  const bool avx512 = avx2 && flags.count("avx512f");
  const Isa want = avx512 && flags.count("avx512bw") && flags.count("avx512_vnni") ? Isa::Avx512Vnni
                   : avx512                                                        ? Isa::Avx512
                   : avx2                                                          ? Isa::Avx2
                                                                                   : Isa::Scalar;
  EXPECT_EQ(K::cpu_isa(), want) << "read " << K::isa_name(K::cpu_isa()) << ", the flags say " << K::isa_name(want);
  // Under TORCHATTN_ISA (the ctest entries unit_isa_*) the kernels take the narrower.
  EXPECT_EQ(K::best_isa(), std::min(want, K::isa_cap()));
#else
  EXPECT_EQ(K::best_isa(), Isa::Scalar);
#endif
}

// Every kernel entry point that takes an instruction set refuses one wider than it runs,
// through the one guard, naming itself, its limit and what it was given.
TEST(CpuFeatures, AKernelRefusesAnInstructionSetWiderThanItRuns) {
  K::check_isa_at_most(Isa::Avx2, Isa::Avx2, "kernel");
  K::check_isa_at_most(Isa::Scalar, Isa::Avx512, "kernel");
  expect_error([] { K::check_isa_at_most(Isa::Avx512, Isa::Avx2, "kernel"); },
               "kernel: expected an instruction set up to avx2, got avx512");
  expect_error([] { K::check_isa_at_most(Isa::Avx2, Isa::Scalar, "kernel"); },
               "kernel: expected an instruction set up to scalar, got avx2");
  if (K::best_isa() == Isa::Avx512Vnni) return;  // every Isa runs here
  const Isa wider = static_cast<Isa>(static_cast<int>(K::best_isa()) + 1);
  const std::string want = std::string(": expected an instruction set up to ") + K::isa_name(K::best_isa()) + ", got " +
                           K::isa_name(wider);
  const std::vector<float> x(16, 1.0f);
  expect_error([&] { K::dot(x.data(), x.data(), 16, wider); }, "dot" + want);
}

// Lane-wise operations of the vector type over n floats, W lanes at a time (the last
// vector partial): out[op * n + i] for each op below.
constexpr int kLaneOps = 18;

TORCHATTN_SIMD_KERNELS_BEGIN
struct LaneOps {
  static constexpr Isa kWidest = Isa::Avx512;
  template <class S>
  static void run(const float* a, const float* b, const float* c, int64_t n, float* out) {
    using V = typename S::V;
    for (int64_t i = 0; i < n; i += S::W) {
      const int lanes = static_cast<int>(std::min<int64_t>(S::W, n - i));
      const V x = S::load(a + i, lanes), y = S::load(b + i, lanes), z = S::load(c + i, lanes);
      const V ops[kLaneOps] = {
          S::fma(x, y, z),
          S::mul(x, y),
          S::add(x, y),
          S::sub(x, y),
          S::div(x, y),
          S::max(x, y),
          S::min(x, y),
          S::round(S::mul(x, S::set1(3.0f))),
          S::abs(x),
          S::with_sign(S::abs(y), x),
          S::below(x, 0.25f, y, z),
          S::ldexp(y, S::round(S::mul(S::abs(z), S::set1(-20.0f)))),
          S::iota(i - 5),
          S::keep_between(x, i, 3, n - 4, -1.5f),
          S::zero_where_equal(x, K::simd::kNegInf, y),
          S::load_or(a + i, lanes, 7.0f),
          S::exp_neg(S::mul(S::abs(x), S::set1(-8.0f))),
          S::tanh(S::mul(x, S::set1(3.0f))),
      };
      for (int op = 0; op < kLaneOps; ++op) S::store(out + op * n + i, ops[op], lanes);
    }
  }
};

// The three reductions of W consecutive floats.
struct Reductions {
  static constexpr Isa kWidest = Isa::Avx512;
  template <class S>
  static void run(const float* a, float* out) {
    out[0] = S::reduce_add(S::load(a));
    out[1] = S::reduce_add_adjacent(S::load(a));
    out[2] = S::reduce_max(S::load(a));
  }
};

// narrow(): n floats holding integers in [0, 255] as bytes, W lanes at a time.
struct Narrow {
  static constexpr Isa kWidest = Isa::Avx512;
  template <class S>
  static void run(const float* a, int64_t n, uint8_t* out) {
    for (int64_t i = 0; i < n; i += S::W) {
      const int lanes = static_cast<int>(std::min<int64_t>(S::W, n - i));
      S::narrow(out + i, S::load(a + i, lanes), lanes);
    }
  }
};

// transpose8(): an 8 x 8 square of floats transposed, whatever the type's width.
struct Transpose8 {
  static constexpr Isa kWidest = Isa::Avx512;
  template <class S>
  static void run(const float* src, int64_t src_stride, float* dst, int64_t dst_stride) {
    S::transpose8(src, src_stride, dst, dst_stride);
  }
};

struct Width {
  static constexpr Isa kWidest = Isa::Avx512;
  template <class S>
  static int run() {
    return S::W;
  }
};

// The integer operations of the types that have them (Avx2, Avx512Vnni; the int8
// products): out gets, in order, kBytes / 4 lanes each of dot(acc, a, b) (Avx2's
// dot_signed with a as magnitudes and s as signs; Avx512Vnni's dot_unsigned of a),
// iload(a, n) as bytes, ibroadcast4(a), then sum_four(x0..x3) (4 lanes) and
// reduce_add(x0) (1), where x_j = iload(wide + j * kLanes) (int32 lanes whose sums fit
// in int32, as the kernels' sums of byte products do). Returns false for a type without
// them.
struct ByteOps {
  static constexpr Isa kWidest = Isa::Avx512Vnni;
  template <class S>
  static bool run(const uint8_t* a, const int8_t* s, const int8_t* b, const int32_t* acc, const int32_t* wide, int n,
                  int32_t* out) {
    if constexpr (requires { typename S::I; }) {
      using I = typename S::I;
      constexpr int kLanes = S::kBytes / 4;
      I d;
      if constexpr (S::kIsa == Isa::Avx512Vnni) {
        d = S::dot_unsigned(S::iload(acc), S::iload(a), S::iload(b));
      } else {
        d = S::dot_signed(S::iload(acc), S::iload(a), S::iload(s), S::iload(b));
      }
      std::memcpy(out, &d, sizeof d);
      const I part = S::iload(a, n), four = S::ibroadcast4(a);
      std::memcpy(out + kLanes, &part, sizeof part);
      std::memcpy(out + 2 * kLanes, &four, sizeof four);
      const I x0 = S::iload(wide), x1 = S::iload(wide + kLanes), x2 = S::iload(wide + 2 * kLanes),
              x3 = S::iload(wide + 3 * kLanes);
      const __m128i sums = S::sum_four(x0, x1, x2, x3);
      std::memcpy(out + 3 * kLanes, &sums, sizeof sums);
      out[3 * kLanes + 4] = S::reduce_add(x0);
      return true;
    } else {
      return false;
    }
  }
};

struct InOrder {
  static constexpr Isa kWidest = Isa::Avx2;
  template <class S>
  static float run(const float* t, const float* x, float acc) {
    if constexpr (S::kIsa == Isa::Avx2) {
      return K::simd::Four::fma_in_order(K::simd::Four::load(t), K::simd::Four::load(x), acc);
    } else {
      return acc;
    }
  }
};
TORCHATTN_SIMD_KERNELS_END

int lanes_of(Isa isa) { return K::simd::run_on<Width>(isa); }

uint32_t float_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

TEST(Simd, EveryVectorTypeGivesTheScalarTypesBitsLaneForLane) {
  torch::manual_seed(3);
  const int64_t n = 37;  // a partial vector at the end for 8 and 16 lanes
  auto a = torch::randn({n}), b = torch::randn({n}) + 0.1, c = torch::randn({n});
  a[4] = -INFINITY;
  a[21] = -INFINITY;
  b[5] = 0.0f;  // x / 0
  const auto run = [&](Isa isa) {
    std::vector<float> out(kLaneOps * n + 32, 99.0f);
    K::simd::run_on<LaneOps>(isa, a.const_data_ptr<float>(), b.const_data_ptr<float>(), c.const_data_ptr<float>(), n,
                             out.data());
    return out;
  };
  const auto want = run(Isa::Scalar);
  for (const Isa isa : K::supported_isas()) {
    SCOPED_TRACE(K::isa_name(isa));
    const auto got = run(isa);
    for (int op = 0; op < kLaneOps; ++op) {
      for (int64_t i = 0; i < n; ++i) {
        const float g = got[op * n + i], w = want[op * n + i];
        if (op >= 16) {  // exp, tanh: polynomials against libm
          EXPECT_NEAR(g, w, 4e-7f * std::max(1.0f, std::abs(w))) << "op " << op << " lane " << i;
        } else {
          EXPECT_EQ(float_bits(g), float_bits(w)) << "op " << op << " lane " << i << ": " << g << " vs " << w;
        }
      }
    }
    // Past the last partial store: untouched.
    for (size_t i = kLaneOps * n; i < got.size(); ++i) EXPECT_EQ(got[i], 99.0f);
  }
}

// The scalar round is nearbyint's value (ties to even, the sign of zero kept) without its
// library call: on ties, signs, the edges of 2^22 and 2^23, large values, infinities and
// NaN, and on random values at every scale.
TEST(Simd, ScalarRoundIsNearbyintBitForBit) {
  std::vector<float> values = {0.0f,
                               -0.0f,
                               0.5f,
                               -0.5f,
                               1.5f,
                               2.5f,
                               -2.5f,
                               0.49999997f,
                               3.5f,
                               -3.5f,
                               14.5f,
                               15.5f,
                               4194303.5f,
                               4194304.5f,
                               8388607.5f,
                               -8388607.5f,
                               8388608.0f,
                               8388609.0f,
                               1e20f,
                               -1e20f,
                               1e-40f,
                               -1e-40f,
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::max(),
                               std::numeric_limits<float>::denorm_min()};
  torch::manual_seed(5);
  const auto r =
      (torch::randn({4000}) * torch::pow(10.0, torch::randint(-3, 9, {4000}).to(torch::kFloat))).contiguous();
  values.insert(values.end(), r.const_data_ptr<float>(), r.const_data_ptr<float>() + r.numel());
  for (const float v : values) {
    EXPECT_EQ(float_bits(K::simd::Scalar::round(v)), float_bits(std::nearbyint(v))) << v;
  }
  EXPECT_TRUE(std::isnan(K::simd::Scalar::round(std::numeric_limits<float>::quiet_NaN())));
}

// transpose8 moves each of the 64 floats of a square within rows 11 floats apart into
// columns of rows 13 apart (both not multiples of a vector), and writes nothing else.
TEST(Simd, Transpose8MovesEveryFloatOfTheSquareAndNothingElse) {
  torch::manual_seed(6);
  const int64_t src_stride = 11, dst_stride = 13;
  const auto src = torch::randn({8 * src_stride});
  const float* x = src.const_data_ptr<float>();
  for (const Isa isa : K::supported_isas()) {
    SCOPED_TRACE(K::isa_name(isa));
    std::vector<float> out(8 * dst_stride, -7.0f);
    K::simd::run_on<Transpose8>(isa, x, src_stride, out.data(), dst_stride);
    for (int64_t c = 0; c < dst_stride; ++c) {
      for (int64_t r = 0; r < 8; ++r) {
        const float got = out[static_cast<size_t>(r * dst_stride + c)];
        if (c < 8) {
          EXPECT_EQ(float_bits(got), float_bits(x[c * src_stride + r])) << "row " << r << ", column " << c;
        } else {
          EXPECT_EQ(got, -7.0f) << "past the square: row " << r << ", column " << c;
        }
      }
    }
  }
}

// narrow stores each lane's integer as its byte, 0 and 255 included, and nothing past n.
TEST(Simd, NarrowStoresTheLanesAsBytes) {
  torch::manual_seed(5);
  const int64_t n = 37;
  auto a = torch::randint(0, 256, {n}).to(torch::kFloat);
  a[0] = 0.0f;
  a[1] = 255.0f;
  for (const Isa isa : K::supported_isas()) {
    SCOPED_TRACE(K::isa_name(isa));
    std::vector<uint8_t> out(n + 16, 7);
    K::simd::run_on<Narrow>(isa, a.const_data_ptr<float>(), n, out.data());
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(out[i], static_cast<uint8_t>(a[i].item<float>())) << "lane " << i;
    for (size_t i = n; i < out.size(); ++i) EXPECT_EQ(out[i], 7) << "past n: " << i;
  }
}

TEST(Simd, ReductionsAddInTheirDocumentedOrder) {
  torch::manual_seed(4);
  // Magnitudes far apart, so that another order gives other bits.
  const auto a = (torch::randn({16}) * torch::pow(10.0, torch::randint(-6, 7, {16}))).to(torch::kFloat);
  const float* l = a.const_data_ptr<float>();
  for (const Isa isa : K::supported_isas()) {
    SCOPED_TRACE(K::isa_name(isa));
    const int W = lanes_of(isa);
    float got[3];
    K::simd::run_on<Reductions>(isa, l, got);
    // 16 lanes fold to 8, 8 to 4.
    std::vector<float> m(l, l + W);
    if (W == 16) {
      for (int i = 0; i < 8; ++i) m[i] = l[i] + l[i + 8];
    }
    float want_add = m[0], want_adjacent = m[0], want_max = *std::max_element(l, l + W);
    if (W >= 8) {
      float h[4];
      for (int i = 0; i < 4; ++i) h[i] = m[i] + m[i + 4];
      want_add = (h[0] + h[2]) + (h[1] + h[3]);
      want_adjacent = (h[0] + h[1]) + (h[2] + h[3]);
    }
    EXPECT_EQ(float_bits(got[0]), float_bits(want_add));
    EXPECT_EQ(float_bits(got[1]), float_bits(want_adjacent));
    EXPECT_EQ(float_bits(got[2]), float_bits(want_max));
  }
}

// The results dot's documented order allows for `lanes` lanes (vec.h): with vectors,
// the vector part to the bit, then each product of the tail in order, fused into its
// add or not (the compiler's choice); one lane: in order, multiply then add.
std::set<uint32_t> dot_in_order(const float* a, const float* b, int64_t n, int lanes) {
  int64_t i = 0;
  if (lanes == 1) {
    float total = 0.0f;
    for (; i < n; ++i) {
      const float p = a[i] * b[i];
      total += p;
    }
    return {float_bits(total)};
  }
  std::vector<float> acc(4 * lanes, 0.0f);
  for (; i + 4 * lanes <= n; i += 4 * lanes) {
    for (int k = 0; k < 4 * lanes; ++k) acc[k] = std::fma(a[i + k], b[i + k], acc[k]);
  }
  for (; i + lanes <= n; i += lanes) {
    for (int k = 0; k < lanes; ++k) acc[k] = std::fma(a[i + k], b[i + k], acc[k]);
  }
  // The four accumulators added (a0 + a1) + (a2 + a3), the lanes folded in halves down
  // to four, then adjacent pairs (reduce_add_adjacent).
  std::vector<float> m(static_cast<size_t>(lanes));
  for (int k = 0; k < lanes; ++k) m[k] = (acc[k] + acc[lanes + k]) + (acc[2 * lanes + k] + acc[3 * lanes + k]);
  while (m.size() > 4) {
    const size_t h = m.size() / 2;
    for (size_t k = 0; k < h; ++k) m[k] = m[k] + m[k + h];
    m.resize(h);
  }
  std::vector<float> totals{(m[0] + m[1]) + (m[2] + m[3])};
  for (; i < n; ++i) {
    std::vector<float> next;
    for (const float t : totals) {
      const float p = a[i] * b[i];
      next.push_back(std::fma(a[i], b[i], t));
      next.push_back(t + p);
    }
    totals = next;
  }
  std::set<uint32_t> out;
  for (const float t : totals) out.insert(float_bits(t));
  return out;
}

// The integer register's operations against plain integer arithmetic, lane for lane:
// the byte products exact (AVX2's int16 pairs at their largest, 2 * 127 * 127, do not
// saturate), partial loads zero past n, the sums of four registers and of one.
TEST(Simd, TheByteProductsAndIntegerSumsAreExact) {
  torch::manual_seed(6);
  constexpr int kMax = 64;
  std::vector<uint8_t> a(kMax);
  std::vector<int8_t> sgn(kMax), b(kMax);
  std::vector<int32_t> acc(kMax / 4), wide(kMax);
  const auto rw = torch::randint(-1000000, 1000000, {kMax});
  for (int i = 0; i < kMax; ++i) wide[i] = static_cast<int32_t>(rw[i].item<int64_t>());
  const auto ra = torch::randint(0, 256, {kMax}), rb = torch::randint(-127, 128, {kMax}),
             rs = torch::randint(-1, 2, {kMax}), racc = torch::randint(-100000, 100000, {kMax / 4});
  for (int i = 0; i < kMax; ++i) a[i] = static_cast<uint8_t>(ra[i].item<int64_t>());
  for (int i = 0; i < kMax; ++i) {
    b[i] = static_cast<int8_t>(rb[i].item<int64_t>());
    sgn[i] = static_cast<int8_t>(rs[i].item<int64_t>() * 100);  // negative, zero or positive
  }
  for (int i = 0; i < kMax / 4; ++i) acc[i] = static_cast<int32_t>(racc[i].item<int64_t>());
  b[0] = b[1] = -127;  // a pair at AVX2's largest: 2 * 127 * 127
  sgn[0] = sgn[1] = 1;
  a[0] = a[1] = 127;
  int tried = 0;
  for (const Isa isa : K::supported_isas()) {
    SCOPED_TRACE(K::isa_name(isa));
    const int bytes = isa == Isa::Avx512Vnni ? 64 : isa == Isa::Avx2 ? 32 : 0;
    if (bytes == 0) continue;
    const int lanes = bytes / 4, n = bytes - 5;
    std::vector<int32_t> out(3 * lanes + 5, 0);
    std::vector<uint8_t> mag(a.begin(), a.end());
    if (isa == Isa::Avx2) {
      for (int i = 0; i < bytes; ++i) mag[i] = a[i] & 0x7f;  // vpmaddubsw's magnitudes: at most 127
    }
    ASSERT_TRUE(
        K::simd::run_on<ByteOps>(isa, mag.data(), sgn.data(), b.data(), acc.data(), wide.data(), n, out.data()));
    ++tried;
    for (int l = 0; l < lanes; ++l) {
      int32_t want = acc[l];
      for (int k = 4 * l; k < 4 * l + 4; ++k) {
        const int32_t w = isa == Isa::Avx2 ? (sgn[k] > 0 ? b[k] : sgn[k] < 0 ? -b[k] : 0) : b[k];
        want += static_cast<int32_t>(mag[k]) * w;
      }
      EXPECT_EQ(out[l], want) << "dot, lane " << l;
      int32_t part = 0, four = 0;
      std::memcpy(&four, mag.data(), 4);
      for (int k = 0; k < 4; ++k) {
        const int i = 4 * l + k;
        part |= static_cast<int32_t>(i < n ? mag[i] : 0) << (8 * k);
      }
      EXPECT_EQ(out[lanes + l], part) << "iload(p, n), lane " << l;
      EXPECT_EQ(out[2 * lanes + l], four) << "ibroadcast4, lane " << l;
    }
    for (int j = 0; j < 4; ++j) {
      int64_t want = 0;
      for (int l = 0; l < lanes; ++l) want += wide[j * lanes + l];
      EXPECT_EQ(out[3 * lanes + j], static_cast<int32_t>(want)) << "sum_four, register " << j;
      if (j == 0) {
        EXPECT_EQ(out[3 * lanes + 4], static_cast<int32_t>(want)) << "reduce_add";
      }
    }
  }
  // Four's fused multiply-adds, one at a time in order.
  if (K::best_isa() >= Isa::Avx2) {
    EXPECT_GT(tried, 0);
    const float t[4] = {1e8f, -3.0f, 1.0f / 3.0f, 7e-8f}, x[4] = {1.0f + 1e-7f, 1e8f, 3.0f, 1.0f};
    float want = 0.5f;
    for (int k = 0; k < 4; ++k) want = std::fma(t[k], x[k], want);
    EXPECT_EQ(float_bits(K::simd::run_on<InOrder>(Isa::Avx2, t, x, 0.5f)), float_bits(want));
  }
}

TEST(Simd, DotAndAxpyFollowTheirDocumentedOrderOnEveryIsa) {
  torch::manual_seed(5);
  for (const Isa isa : K::supported_isas()) {
    SCOPED_TRACE(K::isa_name(isa));
    const int lanes = lanes_of(isa);
    for (const int64_t n : {1, 7, 8, 9, 31, 32, 33, 40, 64, 71, 576}) {
      SCOPED_TRACE("n " + std::to_string(n));
      const auto a = torch::randn({n}), b = torch::randn({n});
      const float* ap = a.const_data_ptr<float>();
      const float* bp = b.const_data_ptr<float>();
      const float got = K::dot(ap, bp, n, isa);
      EXPECT_EQ(dot_in_order(ap, bp, n, lanes).count(float_bits(got)), 1u) << got;
      if (isa == K::best_isa()) {
        EXPECT_EQ(float_bits(K::dot(ap, bp, n)), float_bits(got));
      }
      // axpy: one FMA per element with vectors (the tail too, by std::fma whatever the
      // optimization level), multiply then add on one lane.
      auto y = torch::randn({n});
      auto y_default = y.clone();
      std::vector<float> want(y.const_data_ptr<float>(), y.const_data_ptr<float>() + n);
      for (int64_t i = 0; i < n; ++i) {
        const float p = 0.7f * ap[i];
        want[i] = lanes > 1 ? std::fma(0.7f, ap[i], want[i]) : want[i] + p;
      }
      K::axpy(0.7f, ap, y.mutable_data_ptr<float>(), n, isa);
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_EQ(float_bits(y[i].item<float>()), float_bits(want[static_cast<size_t>(i)])) << i;
      }
      if (isa == K::best_isa()) {
        K::axpy(0.7f, ap, y_default.mutable_data_ptr<float>(), n);
        EXPECT_TRUE(torch::equal(y_default, y));
      }
    }
  }
}

// narrow_halves: c10::Half's bits (round to nearest, ties to even) on every instruction
// set, over ties, the edges of float16's range (65504, the 65520 that rounds to an
// infinity, the subnormals down to 2^-25), zeros of both signs, infinities and values at
// many scales; a NaN stays a NaN.
TEST(Simd, NarrowHalvesGiveC10HalfsBits) {
  torch::manual_seed(7);
  std::vector<float> x = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.0f,
                          65504.0f,
                          65519.996f,
                          65520.0f,
                          -65520.0f,
                          65536.0f,
                          1e30f,
                          6.1035156e-05f /* 2^-14 */,
                          6.1035149e-05f,
                          5.9604645e-08f /* 2^-24 */,
                          2.9802322e-08f /* 2^-25: a tie, to 0 */,
                          2.9802326e-08f,
                          8.940697e-08f /* 1.5 * 2^-24: a tie, to 2^-23 */,
                          1e-45f,
                          -3e-39f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()};
  for (int k = 0; k < 64; ++k) {  // ties of the normal range: 1 + (2 k + 1) 2^-11, and scaled
    const float tie = 1.0f + static_cast<float>(2 * k + 1) / 2048.0f;
    x.push_back(tie);
    x.push_back(-std::ldexp(tie, k % 30 - 14));
  }
  for (int e = -30; e <= 18; e += 2) {
    const auto r = torch::randn({37}) * std::ldexp(1.0f, e);
    x.insert(x.end(), r.const_data_ptr<float>(), r.const_data_ptr<float>() + r.numel());
  }
  x.push_back(std::numeric_limits<float>::quiet_NaN());
  const auto n = static_cast<int64_t>(x.size());
  for (const Isa isa : K::supported_isas()) {
    SCOPED_TRACE(K::isa_name(isa));
    for (const int64_t count : {n, n - 1, int64_t{5}}) {  // whole vectors and tails
      std::vector<uint16_t> got(static_cast<size_t>(count), 0);
      K::narrow_halves(x.data(), count, got.data(), isa);
      for (int64_t i = 0; i < count; ++i) {
        const float v = x[static_cast<size_t>(i)];
        const uint16_t g = got[static_cast<size_t>(i)];
        if (std::isnan(v)) {
          EXPECT_TRUE((g & 0x7c00u) == 0x7c00u && (g & 0x3ffu) != 0) << "NaN -> " << g;
        } else {
          EXPECT_EQ(g, c10::Half(v).x) << "value " << i << ": " << v;
        }
      }
    }
  }
}

// dots and axpys: the bits of dot and axpy called row by row; axpys skips a weight of
// 0 without reading its row (NaN there would show).
TEST(Simd, DotsAndAxpysEqualTheirOneRowCalls) {
  torch::manual_seed(6);
  for (const int64_t n : {1, 9, 64, 71}) {
    for (const int64_t count : {1, 5, 33}) {
      SCOPED_TRACE("n " + std::to_string(n) + " count " + std::to_string(count));
      const int64_t stride = n + 3;
      const auto a = torch::randn({n});
      auto rows = torch::randn({count, stride});
      const float* ap = a.const_data_ptr<float>();
      std::vector<float> got(static_cast<size_t>(count));
      K::dots(ap, rows.const_data_ptr<float>(), stride, count, n, got.data());
      for (int64_t j = 0; j < count; ++j) {
        EXPECT_EQ(float_bits(got[static_cast<size_t>(j)]), float_bits(K::dot(ap, rows[j].const_data_ptr<float>(), n)))
            << j;
      }
      std::vector<float> alpha(static_cast<size_t>(count));
      for (int64_t j = 0; j < count; ++j) {
        alpha[static_cast<size_t>(j)] = j % 3 == 1 ? 0.0f : 0.25f + 0.5f * static_cast<float>(j);
        if (j % 3 == 1) rows[j].fill_(std::numeric_limits<float>::quiet_NaN());
      }
      auto y = torch::randn({n});
      auto want = y.clone();
      K::axpys(alpha.data(), rows.const_data_ptr<float>(), stride, count, y.mutable_data_ptr<float>(), n);
      for (int64_t j = 0; j < count; ++j) {
        if (alpha[static_cast<size_t>(j)] != 0.0f) {
          K::axpy(alpha[static_cast<size_t>(j)], rows[j].const_data_ptr<float>(), want.mutable_data_ptr<float>(), n);
        }
      }
      EXPECT_TRUE(torch::equal(y, want));
      EXPECT_FALSE(y.isnan().any().item<bool>());
    }
  }
}

// matvec: each row in the order vec.h documents (two accumulators of the ISA's lanes,
// at most kMatvecWidest's, over blocks of twice the lanes, one more block into the
// first, the lanes folded as reduce_add_adjacent, then the tail fused), the same bits
// wherever the row falls in a call or in one stream or four, and the default's bits
// those of best_isa().
float matvec_row_in_order(const float* x, const float* w, int64_t n, int lanes) {
  int64_t i = 0;
  float total = 0.0f;
  if (lanes > 1) {
    std::vector<float> a(static_cast<size_t>(lanes), 0.0f), c = a;
    for (; i + 2 * lanes <= n; i += 2 * lanes) {
      for (int l = 0; l < lanes; ++l) {
        a[l] = std::fma(x[i + l], w[i + l], a[l]);
        c[l] = std::fma(x[i + lanes + l], w[i + lanes + l], c[l]);
      }
    }
    if (i + lanes <= n) {
      for (int l = 0; l < lanes; ++l) a[l] = std::fma(x[i + l], w[i + l], a[l]);
      i += lanes;
    }
    std::vector<float> m(static_cast<size_t>(lanes));
    for (int l = 0; l < lanes; ++l) m[l] = a[l] + c[l];
    while (m.size() > 4) {
      const size_t h = m.size() / 2;
      for (size_t l = 0; l < h; ++l) m[l] = m[l] + m[l + h];
      m.resize(h);
    }
    total = (m[0] + m[1]) + (m[2] + m[3]);
    for (; i < n; ++i) total = std::fma(x[i], w[i], total);
    return total;
  }
  for (; i < n; ++i) total += x[i] * w[i];
  return total;
}

TEST(Simd, MatvecSumsEachRowInItsDocumentedOrderWhereverItFalls) {
  torch::manual_seed(7);
  {
    const auto x = torch::randn({8});
    float y = 0.0f;
    expect_error([&] { K::matvec(x.const_data_ptr<float>(), x.const_data_ptr<float>(), 8, 1, &y, Isa::Scalar, 2); },
                 "matvec: expected 1 or 4 streams, got 2");
  }
  for (const Isa isa : K::supported_isas()) {
    SCOPED_TRACE(K::isa_name(isa));
    const int lanes = lanes_of(std::min(isa, K::kMatvecWidest));  // AVX-512 runs AVX2's (vec.h)
    for (const int64_t n : {1, 7, 8, 9, 15, 16, 17, 24, 31, 33, 64, 71, 576}) {
      for (const int64_t count : {1, 3, 4, 5, 9, 12, 37}) {
        SCOPED_TRACE("n " + std::to_string(n) + " count " + std::to_string(count));
        const auto x = torch::randn({n}), w = torch::randn({count, n});
        const float* xp = x.const_data_ptr<float>();
        const float* wp = w.const_data_ptr<float>();
        std::vector<float> got(static_cast<size_t>(count)), one_stream(got.size());
        K::matvec(xp, wp, n, count, got.data(), isa, 4);
        K::matvec(xp, wp, n, count, one_stream.data(), isa, 1);
        EXPECT_EQ(one_stream, got);
        const auto want64 = torch::mv(w.to(torch::kDouble), x.to(torch::kDouble));
        for (int64_t j = 0; j < count; ++j) {
          const float g = got[static_cast<size_t>(j)];
          EXPECT_EQ(float_bits(g), float_bits(matvec_row_in_order(xp, wp + j * n, n, lanes))) << j;
          // The row alone, and the rows from j on (another place in a block of four).
          float alone = 0.0f;
          K::matvec(xp, wp + j * n, n, 1, &alone, isa, 4);
          EXPECT_EQ(float_bits(alone), float_bits(g)) << j;
          std::vector<float> from_j(static_cast<size_t>(count - j));
          K::matvec(xp, wp + j * n, n, count - j, from_j.data(), isa, 4);
          EXPECT_EQ(float_bits(from_j[0]), float_bits(g)) << j;
          EXPECT_NEAR(g, want64[j].item<double>(), 1e-4 * std::sqrt(static_cast<double>(n))) << j;
        }
        if (isa == K::best_isa()) {
          std::vector<float> by_default(static_cast<size_t>(count));
          K::matvec(xp, wp, n, count, by_default.data());
          EXPECT_EQ(by_default, got);
        }
      }
    }
  }
}

}  // namespace

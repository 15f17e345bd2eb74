#pragma once

// The SIMD layer of the CPU kernels: a vector type per instruction set (Scalar: one
// float; Avx2: __m256, 8 lanes, with FMA and F16C; Avx512: __m512, 16 lanes; Avx512Vnni:
// Avx512's, with VNNI's byte products), each a struct of static operations on its
// register type V (and, for the int8 products, on its integer register I), and
// run_on<Kernel>(isa, args...), which runs a kernel written once as a template over
// the vector type with the instructions of `isa` (cpu_features.h says which this CPU
// has).
//
// The library compiles without -mavx flags: the x86 types' operations carry target
// attributes, and run_on enters each instruction set through a function of that
// target which inlines the whole kernel (flatten), its operations included. A kernel:
//
//   struct Twice {
//     static constexpr Isa kWidest = Isa::Avx512;  // the widest it is instantiated for
//     template <class S> static void run(const float* x, float* y) {
//       S::store(y, S::add(S::load(x), S::load(x)));
//     }
//   };
//   run_on<Twice>(best_isa(), x, y);
//
// Shipped, but private (include/torchattn/detail/, with cpu_features.h, parallel.h and
// row_softmax.h: no promise of a stable API) so that kernels instantiated in a user's
// translation unit, flex_attention's (detail/flex/cpu_forward_tiles.h), are written on
// it too; its names stay the kernels' own, torchattn::kernels::cpu.
//
// The operations round as the instructions do, so a kernel's numbers depend on its
// vector type only through what it asks for (FMA or multiply then add, lane widths,
// the order of its reductions). Lanes hold NaN only from NaN inputs; what the masking
// operations make of a NaN lane is each instruction set's own (noted where it differs).

#include <torchattn/detail/kernels/cpu/cpu_features.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#if defined(TORCHATTN_SIMD_X86)
#include <immintrin.h>
#endif

// Around the kernels written over the vector types (and in this header): GCC warns
// that a template instantiated for an x86 type passes __m256 values without AVX
// (-Wpsabi) in its unused non-target copy (run_on only calls the target one, into
// which everything is inlined); and its AVX-512 headers pass _mm512_undefined_*
// through some intrinsics (roundscale, scalef, extract), which -Wmaybe-uninitialized
// reports once per inlining.
//
// Clang differs from GCC twice. It refuses a vector register passed by value between a
// function of an x86 target and one of none ("changes the ABI"), so under clang the x86
// types' registers are structs holding one (Reg below), whose conversions carry the
// target: the kernels pass structs, and only the operations, all of their target,
// touch the registers. And its flatten inlines one level only, so between
// TORCHATTN_SIMD_KERNELS_BEGIN and _END every function is always_inline: a kernel and
// its helpers fold into the entry point of their instruction set, where the
// operations inline. Functions of a target of their own stand between
// TORCHATTN_SIMD_TARGETS_BEGIN and _END inside such a region: under clang an
// always_inline function of a target cannot be called from a function of none.
#if defined(__GNUC__) && !defined(__clang__)
#define TORCHATTN_SIMD_KERNELS_BEGIN                                           \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wpsabi\"") \
      _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")              \
          _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")
#define TORCHATTN_SIMD_KERNELS_END _Pragma("GCC diagnostic pop")
#define TORCHATTN_SIMD_TARGETS_BEGIN
#define TORCHATTN_SIMD_TARGETS_END
#define TORCHATTN_SIMD_INLINE inline
#elif defined(__clang__) && defined(TORCHATTN_SIMD_X86)
#define TORCHATTN_SIMD_KERNELS_BEGIN \
  _Pragma("clang attribute push(__attribute__((always_inline)), apply_to = function)")
#define TORCHATTN_SIMD_KERNELS_END _Pragma("clang attribute pop")
#define TORCHATTN_SIMD_TARGETS_BEGIN TORCHATTN_SIMD_KERNELS_END
#define TORCHATTN_SIMD_TARGETS_END TORCHATTN_SIMD_KERNELS_BEGIN
#define TORCHATTN_SIMD_INLINE __attribute__((always_inline)) inline
#else
#define TORCHATTN_SIMD_KERNELS_BEGIN
#define TORCHATTN_SIMD_KERNELS_END
#define TORCHATTN_SIMD_TARGETS_BEGIN
#define TORCHATTN_SIMD_TARGETS_END
#define TORCHATTN_SIMD_INLINE inline
#endif
// On a function that calls a user's callable taking registers (flex's mods on Lanes):
// under clang, the calls it makes inline whatever their size, so that the callable's
// operations inline into the kernel's target, not into the callable's own (none).
#if defined(__clang__)
#define TORCHATTN_SIMD_FLATTEN __attribute__((flatten))
#else
#define TORCHATTN_SIMD_FLATTEN
#endif

#if defined(__GNUC__) && !defined(__clang__)
TORCHATTN_SIMD_KERNELS_BEGIN
#endif

namespace torchattn::kernels::cpu::simd {

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The polynomials below take and give their vectors by reference: as functions of no
// target of their own, passing __m256 by value would change GCC's ABI (it warns).

/// out = exp(x) for x <= 0, x clamped at -87, within 2 ulp: Cephes' polynomial on
/// r = x - n ln 2, then * 2^n (S::ldexp). For the x86 types.
template <class S>
TORCHATTN_SIMD_INLINE void exp_neg_poly(const typename S::V& x_in, typename S::V& out) {
  using V = typename S::V;
  const V x = S::max(x_in, S::set1(-87.0f));
  // The polynomial's own constants (ln 2 split in two), kept bit for bit.
  // NOLINTNEXTLINE(modernize-use-std-numbers)
  const V n = S::round(S::mul(x, S::set1(1.44269504088896341f)));
  // NOLINTNEXTLINE(modernize-use-std-numbers)
  const V r = S::fma(n, S::set1(2.12194440e-4f), S::fma(n, S::set1(-0.693359375f), x));
  V y = S::set1(1.9875691500e-4f);
  y = S::fma(y, r, S::set1(1.3981999507e-3f));
  y = S::fma(y, r, S::set1(8.3334519073e-3f));
  y = S::fma(y, r, S::set1(4.1665795894e-2f));
  y = S::fma(y, r, S::set1(1.6666665459e-1f));
  y = S::fma(y, r, S::set1(5.0000001201e-1f));
  y = S::fma(y, S::mul(r, r), S::add(r, S::set1(1.0f)));
  out = S::ldexp(y, n);
}

/// out = tanh(x) within a few ulp: Cephes' tanhf, an odd polynomial below |x| =
/// 0.625, else 1 - 2 / (exp(2|x|) + 1) written with e = exp(-2|x|). For the x86 types.
template <class S>
TORCHATTN_SIMD_INLINE void tanh_poly(const typename S::V& x, typename S::V& out) {
  using V = typename S::V;
  const V a = S::abs(x);
  const V z = S::mul(x, x);
  V small = S::set1(-5.70498872745e-3f);
  small = S::fma(small, z, S::set1(2.06390887954e-2f));
  small = S::fma(small, z, S::set1(-5.37397155531e-2f));
  small = S::fma(small, z, S::set1(1.33314422036e-1f));
  small = S::fma(small, z, S::set1(-3.33332819422e-1f));
  small = S::fma(S::mul(small, z), x, x);
  const V e = S::exp_neg(S::mul(a, S::set1(-2.0f)));
  const V large = S::with_sign(S::div(S::sub(S::set1(1.0f), e), S::add(S::set1(1.0f), e)), x);
  out = S::below(a, 0.625f, small, large);
}

// Every vector type has the operations below (V its register, W its lanes). Loads
// and stores of `n` lanes take the first n (1 <= n <= W) and leave the memory past
// them untouched.

/// One float: plain C++ arithmetic (FMA through std::fma), libm's exp and tanh.
struct Scalar {
  using V = float;
  static constexpr int W = 1;
  static constexpr Isa kIsa = Isa::Scalar;
  /// dst[c * dst_stride + r] = src[r * src_stride + c] for r, c < 8: a square of 8 x 8
  /// floats transposed (every type has it, whatever its W).
  static void transpose8(const float* src, int64_t src_stride, float* dst, int64_t dst_stride) {
    for (int64_t r = 0; r < 8; ++r) {
      for (int64_t c = 0; c < 8; ++c) dst[c * dst_stride + r] = src[r * src_stride + c];
    }
  }
  static V zero() { return 0.0f; }
  static V set1(float x) { return x; }
  static V load(const float* p) { return *p; }
  /// The first n lanes from p, 0 past them.
  static V load(const float* p, int) { return *p; }
  /// The first n lanes from p, `fill` past them.
  static V load_or(const float* p, int, float) { return *p; }
  static void store(float* p, V v) { *p = v; }
  static void store(float* p, V v, int) { *p = v; }
  static V fma(V a, V b, V c) { return std::fma(a, b, c); }  // a * b + c, rounded once
  static V mul(V a, V b) { return a * b; }
  static V add(V a, V b) { return a + b; }
  static V sub(V a, V b) { return a - b; }
  static V div(V a, V b) { return a / b; }
  static V max(V a, V b) { return a > b ? a : b; }  // b where either is NaN, as maxps
  static V min(V a, V b) { return a < b ? a : b; }  // b where either is NaN, as minps
  /// Nearest integer, ties to even (the default rounding mode): nearbyint's value, without
  /// its library call (the library compiles for baseline x86-64, which has no roundss):
  /// adding 2^23 to |a| < 2^23 leaves no fraction bits, so the sum rounds |a| and taking
  /// 2^23 away again is exact. |a| >= 2^23, infinities and NaN are their own.
  static V round(V a) {
    constexpr float kNoFraction = 8388608.0f;  // 2^23
    const float m = std::fabs(a);
    return m < kNoFraction ? std::copysign((m + kNoFraction) - kNoFraction, a) : a;
  }
  static V abs(V a) { return std::fabs(a); }
  /// |magnitude| (a non-negative one) with the sign of `sign`.
  static V with_sign(V magnitude, V sign) { return std::copysign(magnitude, sign); }
  /// `yes` in the lanes where a < bound, `no` elsewhere.
  static V below(V a, float bound, V yes, V no) { return a < bound ? yes : no; }
  /// y * 2^n for integral n in [-126, 0].
  static V ldexp(V y, V n) { return std::ldexp(y, static_cast<int>(n)); }
  /// The lanes' sum, folded in halves: 16 lanes first to 8 (l_i + l_i+8); 8 lanes
  /// to ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
  static float reduce_add(V v) { return v; }
  /// The lanes' sum: folded in halves down to 4 lanes m (m_i = l_i + l_i+4 for 8),
  /// then adjacent pairs: (m0 + m1) + (m2 + m3).
  static float reduce_add_adjacent(V v) { return v; }
  /// The largest lane, in reduce_add's order (maxps: a NaN lane may or may not win).
  static float reduce_max(V v) { return v; }
  /// Lane i holds float(base + i).
  static V iota(int64_t base) { return static_cast<float>(base); }
  /// Lane i keeps v where lo <= first + i <= hi, else holds fill.
  static V keep_between(V v, int64_t first, int64_t lo, int64_t hi, float fill) {
    return first < lo || first > hi ? fill : v;
  }
  /// 0 in the lanes where `test` equals `value`, v elsewhere (a NaN test: v).
  static V zero_where_equal(V test, float value, V v) { return test == value ? 0.0f : v; }
  /// exp(x) for x <= 0.
  static V exp_neg(V x) { return std::exp(x); }
  static V tanh(V x) { return std::tanh(x); }
  /// W int8 values from p as floats (exact).
  static V widen(const int8_t* p) { return static_cast<float>(*p); }
  /// The first n lanes, integers in [0, 255], to p as bytes (exact).
  static void narrow(uint8_t* p, V v, int) { *p = static_cast<uint8_t>(static_cast<int>(v)); }
  /// W bfloat16 values (their bits) from p as floats (exact: the bits moved up).
  static V widen(const uint16_t* p) {
    const uint32_t bits = static_cast<uint32_t>(*p) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  /// W float16 values (their bits) from p as floats (exact, subnormals, infinities and
  /// NaN included), as F16C's vcvtph2ps.
  static V widen_halves(const uint16_t* p) {
    const uint32_t h = *p, sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
      const float f = std::ldexp(static_cast<float>(m), -24);  // zero and the subnormals
      return sign != 0 ? -f : f;
    }
    const uint32_t bits = sign | (e == 31 ? 0x7f800000u : (e + 112) << 23) | (m << 13);
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  /// W floats to p as float16 bits, rounded to the nearest (ties to even), as F16C's
  /// vcvtps2ph with its nearest rounding: past 65504 by half a step or more (65520) an
  /// infinity, below 2^-14 a subnormal, a NaN a quiet NaN keeping its payload's top bits.
  static void narrow_halves(uint16_t* p, V v) {
    uint32_t x = 0;
    std::memcpy(&x, &v, sizeof x);
    const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
    const uint32_t a = x & 0x7fffffffu;
    if (a > 0x7f800000u) {  // NaN
      *p = static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    } else if (a >= 0x477ff000u) {  // 65520 and above, infinities included
      *p = static_cast<uint16_t>(sign | 0x7c00u);
    } else if (a >= 0x38800000u) {  // a normal float16: round at bit 13, rebias 127 -> 15
      *p = static_cast<uint16_t>(sign | ((a + 0x0fffu + ((a >> 13) & 1u) - 0x38000000u) >> 13));
    } else {  // subnormal: multiples of 2^-24 (scaling by 2^24 is exact), 1024 the least normal
      *p = static_cast<uint16_t>(sign | static_cast<uint32_t>(round(std::fabs(v) * 16777216.0f)));
    }
  }
  /// The low (high) 4 bits of W bytes from p, as floats in [0, 15].
  static V widen_low_nibbles(const uint8_t* p) { return static_cast<float>(*p & 15); }
  static V widen_high_nibbles(const uint8_t* p) { return static_cast<float>(*p >> 4); }
};

#if defined(TORCHATTN_SIMD_X86)
// The first n (1 <= n <= 16) bytes of b to p (SSE2, under every x86 type's narrow).
inline void store_first_bytes(uint8_t* p, __m128i b, int n) {
  if (n == 16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), b);
  } else if (n == 8) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), b);
  } else {
    alignas(16) uint8_t bytes[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(bytes), b);
    std::memcpy(p, bytes, static_cast<size_t>(n));
  }
}

// An 8 x 8 square of floats transposed in eight AVX registers (Avx2's and Avx512's
// transpose8): rows interleaved in pairs, then in fours, then the halves of the
// 256-bit registers exchanged.
__attribute__((target("avx2"))) inline void transpose8_avx(const float* src, int64_t src_stride, float* dst,
                                                           int64_t dst_stride) {
  __m256 r[8], t[8], u[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * src_stride);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);  // r_i0 r_(i+1)0 r_i1 r_(i+1)1 | the same of columns 4, 5
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));          // columns 0 | 4 of 4 rows
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));      // 1 | 5
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));  // 2 | 6
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));  // 3 | 7
  }
  for (int c = 0; c < 4; ++c) {
    _mm256_storeu_ps(dst + c * dst_stride, _mm256_permute2f128_ps(u[c], u[c + 4], 0x20));
    _mm256_storeu_ps(dst + (c + 4) * dst_stride, _mm256_permute2f128_ps(u[c], u[c + 4], 0x31));
  }
}

// A register of `Target` as the x86 types hold it: under GCC the register itself;
// under clang (see the top) a struct of it, made from and read as one by conversions
// of that target, which its operations call where they name the register.
#if defined(__clang__)
#define TORCHATTN_SIMD_REG(Name, Raw, Target)                                                      \
  struct Name {                                                                                    \
    Raw r;                                                                                         \
    Name() = default;                                                                              \
    __attribute__((target(Target), always_inline)) Name(Raw raw) : r(raw) {}          /* NOLINT */ \
    __attribute__((target(Target), always_inline)) operator Raw() const { return r; } /* NOLINT */ \
  };
TORCHATTN_SIMD_REG(Reg256, __m256, "avx2,fma,f16c")
TORCHATTN_SIMD_REG(Reg256i, __m256i, "avx2,fma,f16c")
TORCHATTN_SIMD_REG(Reg512, __m512, "avx512f,fma,f16c")
TORCHATTN_SIMD_REG(Reg512i, __m512i, "avx512f,fma,f16c")
#undef TORCHATTN_SIMD_REG
#else
using Reg256 = __m256;
using Reg256i = __m256i;
using Reg512 = __m512;
using Reg512i = __m512i;
#endif

// AVX2's type takes F16C too (vcvtph2ps): every CPU with AVX2 and FMA has it, and
// cpu_features.h asks for all three.
#define TORCHATTN_SIMD_AVX2 __attribute__((target("avx2,fma,f16c"))) static
#define TORCHATTN_SIMD_AVX512 __attribute__((target("avx512f,fma,f16c"))) static

/// AVX2, FMA and F16C: 8 lanes.
struct Avx2 {
  using V = Reg256;
  static constexpr int W = 8;
  static constexpr Isa kIsa = Isa::Avx2;
  TORCHATTN_SIMD_AVX2 void transpose8(const float* src, int64_t src_stride, float* dst, int64_t dst_stride) {
    transpose8_avx(src, src_stride, dst, dst_stride);
  }
  TORCHATTN_SIMD_AVX2 __m256i lanes_below(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  TORCHATTN_SIMD_AVX2 __m256i lane_index(int64_t base) {
    return _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(base)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  TORCHATTN_SIMD_AVX2 V zero() { return _mm256_setzero_ps(); }
  TORCHATTN_SIMD_AVX2 V set1(float x) { return _mm256_set1_ps(x); }
  TORCHATTN_SIMD_AVX2 V load(const float* p) { return _mm256_loadu_ps(p); }
  TORCHATTN_SIMD_AVX2 V load(const float* p, int n) {
    return n == W ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lanes_below(n));
  }
  TORCHATTN_SIMD_AVX2 V load_or(const float* p, int n, float fill) {
    return n == W ? _mm256_loadu_ps(p)
                  : _mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(p, lanes_below(n)),
                                     _mm256_castsi256_ps(lanes_below(n)));
  }
  TORCHATTN_SIMD_AVX2 void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  TORCHATTN_SIMD_AVX2 void store(float* p, V v, int n) {
    if (n == W) {
      _mm256_storeu_ps(p, v);
    } else {
      _mm256_maskstore_ps(p, lanes_below(n), v);
    }
  }
  TORCHATTN_SIMD_AVX2 V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  TORCHATTN_SIMD_AVX2 V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  TORCHATTN_SIMD_AVX2 V add(V a, V b) { return _mm256_add_ps(a, b); }
  TORCHATTN_SIMD_AVX2 V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  TORCHATTN_SIMD_AVX2 V div(V a, V b) { return _mm256_div_ps(a, b); }
  TORCHATTN_SIMD_AVX2 V max(V a, V b) { return _mm256_max_ps(a, b); }
  TORCHATTN_SIMD_AVX2 V min(V a, V b) { return _mm256_min_ps(a, b); }
  TORCHATTN_SIMD_AVX2 V round(V a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  TORCHATTN_SIMD_AVX2 V abs(V a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
  TORCHATTN_SIMD_AVX2 V with_sign(V magnitude, V sign) {
    return _mm256_or_ps(magnitude, _mm256_and_ps(sign, _mm256_set1_ps(-0.0f)));
  }
  TORCHATTN_SIMD_AVX2 V below(V a, float bound, V yes, V no) {
    return _mm256_blendv_ps(no, yes, _mm256_cmp_ps(a, _mm256_set1_ps(bound), _CMP_LT_OQ));
  }
  // n + 127 as the exponent bits.
  TORCHATTN_SIMD_AVX2 V ldexp(V y, V n) {
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  }
  TORCHATTN_SIMD_AVX2 float reduce_add(V v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
  }
  TORCHATTN_SIMD_AVX2 float reduce_add_adjacent(V v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_hadd_ps(h, h);
    h = _mm_hadd_ps(h, h);
    return _mm_cvtss_f32(h);
  }
  TORCHATTN_SIMD_AVX2 float reduce_max(V v) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
  }
  /// Lane indices as int32 (callers keep them within int32).
  TORCHATTN_SIMD_AVX2 V iota(int64_t base) { return _mm256_cvtepi32_ps(lane_index(base)); }
  TORCHATTN_SIMD_AVX2 V keep_between(V v, int64_t first, int64_t lo, int64_t hi, float fill) {
    const __m256i j = lane_index(first);
    const __m256i out = _mm256_or_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(lo)), j),
                                        _mm256_cmpgt_epi32(j, _mm256_set1_epi32(static_cast<int>(hi))));
    return _mm256_blendv_ps(v, _mm256_set1_ps(fill), _mm256_castsi256_ps(out));
  }
  /// (a NaN test: v)
  TORCHATTN_SIMD_AVX2 V zero_where_equal(V test, float value, V v) {
    return _mm256_andnot_ps(_mm256_cmp_ps(test, _mm256_set1_ps(value), _CMP_EQ_OQ), v);
  }
  TORCHATTN_SIMD_AVX2 V exp_neg(V x) {
    V out;
    exp_neg_poly<Avx2>(x, out);
    return out;
  }
  TORCHATTN_SIMD_AVX2 V tanh(V x) {
    V out;
    tanh_poly<Avx2>(x, out);
    return out;
  }
  // The lanes to int32, then to 16 and 8 bits with unsigned saturation (none for
  // [0, 255]), in order.
  TORCHATTN_SIMD_AVX2 void narrow(uint8_t* p, V v, int n) {
    const __m256i i = _mm256_cvtps_epi32(v);
    const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    store_first_bytes(p, _mm_packus_epi16(w, w), n);
  }
  TORCHATTN_SIMD_AVX2 V widen(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  TORCHATTN_SIMD_AVX2 V widen(const uint16_t* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  TORCHATTN_SIMD_AVX2 V widen_halves(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  TORCHATTN_SIMD_AVX2 void narrow_halves(uint16_t* p, V v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  TORCHATTN_SIMD_AVX2 V widen_low_nibbles(const uint8_t* p) {
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    return _mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(15)));
  }
  TORCHATTN_SIMD_AVX2 V widen_high_nibbles(const uint8_t* p) {
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    return _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
  }

  // The integer register of the int8 products (int8_products.h): kBytes bytes, or W
  // int32 lanes. Loads of `n` bytes take the first n (0 <= n <= kBytes), zeros past them.
  using I = Reg256i;
  static constexpr int kBytes = 32;
  TORCHATTN_SIMD_AVX2 I izero() { return _mm256_setzero_si256(); }
  TORCHATTN_SIMD_AVX2 I iload(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
  TORCHATTN_SIMD_AVX2 I iload(const void* p, int n) {
    if (n == kBytes) return iload(p);
    alignas(32) uint8_t bytes[kBytes] = {};
    std::memcpy(bytes, p, static_cast<size_t>(n));
    return _mm256_load_si256(reinterpret_cast<const __m256i*>(bytes));
  }
  /// The 4 bytes at p in every int32 lane.
  TORCHATTN_SIMD_AVX2 I ibroadcast4(const void* p) {
    int32_t four;
    std::memcpy(&four, p, sizeof four);
    return _mm256_set1_epi32(four);
  }
  TORCHATTN_SIMD_AVX2 I iadd(I a, I b) { return _mm256_add_epi32(a, b); }
  /// The int32 lanes as floats (exact below 2^24 in magnitude).
  TORCHATTN_SIMD_AVX2 V to_float(I a) { return _mm256_cvtepi32_ps(a); }
  /// The int32 sums of four registers, a's in lane 0 .. d's in lane 3 (exact).
  TORCHATTN_SIMD_AVX2 __m128i sum_four(I a, I b, I c, I d) {
    const __m256i abcd = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    return _mm_add_epi32(_mm256_castsi256_si128(abcd), _mm256_extracti128_si256(abcd, 1));
  }
  /// The int32 sum of a's lanes (exact).
  TORCHATTN_SIMD_AVX2 int32_t reduce_add(I a) {
    const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    const __m128i h2 = _mm_hadd_epi32(h, h);
    return _mm_cvtsi128_si32(_mm_hadd_epi32(h2, h2));
  }
  /// acc + each int32 lane's four byte products mag_k * (w_k with the sign of sgn_k):
  /// vpmaddubsw's unsigned mag times the signed weights (vpsignb) into int16 pairs (at
  /// most 2 * 127 * 127 for mag <= 127: never saturates), vpmaddwd's pairs into int32.
  TORCHATTN_SIMD_AVX2 I dot_signed(I acc, I mag, I sgn, I w) {
    const __m256i pairs = _mm256_maddubs_epi16(mag, _mm256_sign_epi8(w, sgn));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
  }
};

/// Four float lanes (SSE, VEX-encoded under the x86 types' targets): the int8 products'
/// sums of four groups at a time.
struct Four {
  using V = __m128;
  TORCHATTN_SIMD_AVX2 V zero() { return _mm_setzero_ps(); }
  TORCHATTN_SIMD_AVX2 V load(const float* p) { return _mm_loadu_ps(p); }
  TORCHATTN_SIMD_AVX2 void store(float* p, V v) { _mm_storeu_ps(p, v); }
  TORCHATTN_SIMD_AVX2 V set1(float x) { return _mm_set1_ps(x); }
  /// Lane k holds x[k]: one float from each of four places.
  TORCHATTN_SIMD_AVX2 V gather(float x0, float x1, float x2, float x3) { return _mm_set_ps(x3, x2, x1, x0); }
  TORCHATTN_SIMD_AVX2 V to_float(__m128i a) { return _mm_cvtepi32_ps(a); }
  TORCHATTN_SIMD_AVX2 V mul(V a, V b) { return _mm_mul_ps(a, b); }
  TORCHATTN_SIMD_AVX2 V fma(V a, V b, V c) { return _mm_fmadd_ps(a, b, c); }
  /// acc + t0 * x0 + ... + t3 * x3, one fused multiply-add at a time in that order.
  TORCHATTN_SIMD_AVX2 float fma_in_order(V t, V x, float acc) {
    __m128 a = _mm_set_ss(acc);
    a = _mm_fmadd_ss(t, x, a);
    a = _mm_fmadd_ss(_mm_movehdup_ps(t), _mm_movehdup_ps(x), a);
    a = _mm_fmadd_ss(_mm_movehl_ps(t, t), _mm_movehl_ps(x, x), a);
    return _mm_cvtss_f32(_mm_fmadd_ss(_mm_shuffle_ps(t, t, 3), _mm_shuffle_ps(x, x, 3), a));
  }
};

/// AVX-512F: 16 lanes.
struct Avx512 {
  using V = Reg512;
  static constexpr int W = 16;
  static constexpr Isa kIsa = Isa::Avx512;
  TORCHATTN_SIMD_AVX512 void transpose8(const float* src, int64_t src_stride, float* dst, int64_t dst_stride) {
    transpose8_avx(src, src_stride, dst, dst_stride);
  }
  TORCHATTN_SIMD_AVX512 __mmask16 lanes_below(int n) { return static_cast<__mmask16>((1u << n) - 1u); }
  TORCHATTN_SIMD_AVX512 __m512i lane_index(int64_t base) {
    return _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(base)),
                            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  }
  TORCHATTN_SIMD_AVX512 V zero() { return _mm512_setzero_ps(); }
  TORCHATTN_SIMD_AVX512 V set1(float x) { return _mm512_set1_ps(x); }
  TORCHATTN_SIMD_AVX512 V load(const float* p) { return _mm512_loadu_ps(p); }
  TORCHATTN_SIMD_AVX512 V load(const float* p, int n) {
    return n == W ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(lanes_below(n), p);
  }
  TORCHATTN_SIMD_AVX512 V load_or(const float* p, int n, float fill) {
    return n == W ? _mm512_loadu_ps(p) : _mm512_mask_loadu_ps(_mm512_set1_ps(fill), lanes_below(n), p);
  }
  TORCHATTN_SIMD_AVX512 void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  TORCHATTN_SIMD_AVX512 void store(float* p, V v, int n) {
    if (n == W) {
      _mm512_storeu_ps(p, v);
    } else {
      _mm512_mask_storeu_ps(p, lanes_below(n), v);
    }
  }
  TORCHATTN_SIMD_AVX512 V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  TORCHATTN_SIMD_AVX512 V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  TORCHATTN_SIMD_AVX512 V add(V a, V b) { return _mm512_add_ps(a, b); }
  TORCHATTN_SIMD_AVX512 V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  TORCHATTN_SIMD_AVX512 V div(V a, V b) { return _mm512_div_ps(a, b); }
  TORCHATTN_SIMD_AVX512 V max(V a, V b) { return _mm512_max_ps(a, b); }
  TORCHATTN_SIMD_AVX512 V min(V a, V b) { return _mm512_min_ps(a, b); }
  TORCHATTN_SIMD_AVX512 V round(V a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  TORCHATTN_SIMD_AVX512 V abs(V a) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a), _mm512_set1_epi32(0x7fffffff)));
  }
  TORCHATTN_SIMD_AVX512 V with_sign(V magnitude, V sign) {
    const __m512i bit = _mm512_and_si512(_mm512_castps_si512(sign), _mm512_set1_epi32(static_cast<int>(0x80000000u)));
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(magnitude), bit));
  }
  TORCHATTN_SIMD_AVX512 V below(V a, float bound, V yes, V no) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, _mm512_set1_ps(bound), _CMP_LT_OQ), no, yes);
  }
  TORCHATTN_SIMD_AVX512 V ldexp(V y, V n) { return _mm512_scalef_ps(y, n); }
  /// The upper 8 lanes (the zero-masked extract with every lane kept is the plain one;
  /// GCC 12's plain one warns of its own undefined operand).
  TORCHATTN_SIMD_AVX512 __m256 high_half(V v) {
    return _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xFF, _mm512_castps_pd(v), 1));
  }
  /// The two halves added, then Avx2's.
  TORCHATTN_SIMD_AVX512 __m256 halves_add(V v) { return _mm256_add_ps(_mm512_castps512_ps256(v), high_half(v)); }
  TORCHATTN_SIMD_AVX512 float reduce_add(V v) { return Avx2::reduce_add(Avx2::V(halves_add(v))); }
  TORCHATTN_SIMD_AVX512 float reduce_add_adjacent(V v) { return Avx2::reduce_add_adjacent(halves_add(v)); }
  TORCHATTN_SIMD_AVX512 float reduce_max(V v) {
    const __m256 h = _mm256_max_ps(_mm512_castps512_ps256(v), high_half(v));
    return Avx2::reduce_max(h);
  }
  TORCHATTN_SIMD_AVX512 V iota(int64_t base) { return _mm512_maskz_cvtepi32_ps(0xFFFF, lane_index(base)); }
  TORCHATTN_SIMD_AVX512 V keep_between(V v, int64_t first, int64_t lo, int64_t hi, float fill) {
    const __m512i j = lane_index(first);
    const __mmask16 in = _mm512_cmpge_epi32_mask(j, _mm512_set1_epi32(static_cast<int>(lo))) &
                         _mm512_cmple_epi32_mask(j, _mm512_set1_epi32(static_cast<int>(hi)));
    return _mm512_mask_blend_ps(in, _mm512_set1_ps(fill), v);
  }
  /// (a NaN test: 0)
  TORCHATTN_SIMD_AVX512 V zero_where_equal(V test, float value, V v) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(test, _mm512_set1_ps(value), _CMP_NEQ_OQ), v);
  }
  TORCHATTN_SIMD_AVX512 V exp_neg(V x) {
    V out;
    exp_neg_poly<Avx512>(x, out);
    return out;
  }
  TORCHATTN_SIMD_AVX512 V tanh(V x) {
    V out;
    tanh_poly<Avx512>(x, out);
    return out;
  }
  // To a register, then stored (vpmovdb's masked form to memory is slow on AMD's Zen).
  TORCHATTN_SIMD_AVX512 void narrow(uint8_t* p, V v, int n) {
    store_first_bytes(p, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)), n);
  }
  TORCHATTN_SIMD_AVX512 V widen(const int8_t* p) {
    return _mm512_maskz_cvtepi32_ps(0xFFFF, _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  TORCHATTN_SIMD_AVX512 V widen(const uint16_t* p) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
  TORCHATTN_SIMD_AVX512 V widen_halves(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  TORCHATTN_SIMD_AVX512 void narrow_halves(uint16_t* p, V v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  TORCHATTN_SIMD_AVX512 V widen_low_nibbles(const uint8_t* p) {
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm512_cvtepi32_ps(_mm512_and_si512(b, _mm512_set1_epi32(15)));
  }
  TORCHATTN_SIMD_AVX512 V widen_high_nibbles(const uint8_t* p) {
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4));
  }
};

#define TORCHATTN_SIMD_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni,fma,f16c"))) static

/// AVX-512 with BW and VNNI: Avx512's float lanes, and the integer register of the
/// int8 products (Avx2's operations, 64 bytes or 16 int32 lanes) with vpdpbusd.
struct Avx512Vnni : Avx512 {
  static constexpr Isa kIsa = Isa::Avx512Vnni;
  using I = Reg512i;
  static constexpr int kBytes = 64;
  TORCHATTN_SIMD_VNNI I izero() { return _mm512_setzero_si512(); }
  TORCHATTN_SIMD_VNNI I iload(const void* p) { return _mm512_loadu_si512(p); }
  /// Masked where n < kBytes only: on AMD's Zen 5 a masked vmovdqu8 streams at a quarter
  /// of a plain load's rate (one row of x over 128 MB of int8 weights, one core: 5.7 GB/s
  /// with masked loads of every group against 20.4 GB/s).
  TORCHATTN_SIMD_VNNI I iload(const void* p, int n) {
    if (n == kBytes) return iload(p);
    return _mm512_maskz_loadu_epi8((__mmask64{1} << n) - 1, p);
  }
  TORCHATTN_SIMD_VNNI I ibroadcast4(const void* p) {
    int32_t four;
    std::memcpy(&four, p, sizeof four);
    return _mm512_set1_epi32(four);
  }
  TORCHATTN_SIMD_VNNI I iadd(I a, I b) { return _mm512_add_epi32(a, b); }
  TORCHATTN_SIMD_VNNI I isub(I a, I b) { return _mm512_sub_epi32(a, b); }
  TORCHATTN_SIMD_VNNI V to_float(I a) { return _mm512_cvtepi32_ps(a); }
  TORCHATTN_SIMD_VNNI __m128i sum_four(I a, I b, I c, I d) {
    const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    const __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
    __m512i u = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
    u = _mm512_add_epi32(u, _mm512_shuffle_i32x4(u, u, _MM_SHUFFLE(1, 0, 3, 2)));
    u = _mm512_add_epi32(u, _mm512_shuffle_i32x4(u, u, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm512_castsi512_si128(u);
  }
  TORCHATTN_SIMD_VNNI int32_t reduce_add(I a) { return _mm512_reduce_add_epi32(a); }
  /// acc + each int32 lane's four byte products u_k * w_k, u unsigned, w signed
  /// (vpdpbusd: exact, no saturation).
  TORCHATTN_SIMD_VNNI I dot_unsigned(I acc, I u, I w) { return _mm512_dpbusd_epi32(acc, u, w); }
};

#undef TORCHATTN_SIMD_AVX2
#undef TORCHATTN_SIMD_AVX512
#undef TORCHATTN_SIMD_VNNI

namespace detail {
// The entry points of the x86 instruction sets: functions of their target into which
// the kernel and every operation it calls are inlined.
template <class Kernel, class... Args>
__attribute__((target("avx2,fma,f16c"), flatten)) auto on_avx2(Args&&... args) {
  return Kernel::template run<Avx2>(std::forward<Args>(args)...);
}
template <class Kernel, class... Args>
__attribute__((target("avx512f,fma,f16c"), flatten)) auto on_avx512(Args&&... args) {
  return Kernel::template run<Avx512>(std::forward<Args>(args)...);
}
template <class Kernel, class... Args>
__attribute__((target("avx512f,avx512bw,avx512vnni,fma,f16c"), flatten)) auto on_avx512vnni(Args&&... args) {
  return Kernel::template run<Avx512Vnni>(std::forward<Args>(args)...);
}
}  // namespace detail
#endif

/// Kernel::run<S>(args...) through S's entry point (S a type this CPU runs; off x86,
/// Scalar only): for a caller that has chosen the type already.
template <class S, class Kernel, class... Args>
decltype(auto) run_as(Args&&... args) {
#if defined(TORCHATTN_SIMD_X86)
  if constexpr (S::kIsa == Isa::Avx512Vnni) {
    return detail::on_avx512vnni<Kernel>(std::forward<Args>(args)...);
  } else if constexpr (S::kIsa == Isa::Avx512) {
    return detail::on_avx512<Kernel>(std::forward<Args>(args)...);
  } else if constexpr (S::kIsa == Isa::Avx2) {
    return detail::on_avx2<Kernel>(std::forward<Args>(args)...);
  } else {
    return Kernel::template run<S>(std::forward<Args>(args)...);
  }
#else
  return Kernel::template run<S>(std::forward<Args>(args)...);
#endif
}

/// Kernel::run<S>(args...) for the vector type S of `isa`, or of Kernel::kWidest
/// where `isa` is wider (a kernel is instantiated up to its kWidest only). `isa` must
/// be one this CPU runs (supported_isas()); off x86, Scalar whatever `isa`.
template <class Kernel, class... Args>
decltype(auto) run_on(Isa isa, Args&&... args) {
#if defined(TORCHATTN_SIMD_X86)
  if constexpr (Kernel::kWidest >= Isa::Avx512Vnni) {
    if (isa >= Isa::Avx512Vnni) return detail::on_avx512vnni<Kernel>(std::forward<Args>(args)...);
  }
  if constexpr (Kernel::kWidest >= Isa::Avx512) {
    if (isa >= Isa::Avx512) return detail::on_avx512<Kernel>(std::forward<Args>(args)...);
  }
  if constexpr (Kernel::kWidest >= Isa::Avx2) {
    if (isa >= Isa::Avx2) return detail::on_avx2<Kernel>(std::forward<Args>(args)...);
  }
#endif
  return Kernel::template run<Scalar>(std::forward<Args>(args)...);
}

}  // namespace torchattn::kernels::cpu::simd

#if defined(__GNUC__) && !defined(__clang__)
TORCHATTN_SIMD_KERNELS_END
#endif

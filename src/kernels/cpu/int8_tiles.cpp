// The kernels of the int8 products (int8_products.h), written once over the integer
// registers of simd.h's types and entered through run_on: the portable loop (Scalar),
// AVX2's vpmaddubsw (Avx2, and Avx512, which has no byte product of its own) and
// VNNI's vpdpbusd (Avx512Vnni). What differs between the instruction sets is how x's
// bytes meet the weights and the shapes that measured best, both in Bytes<S>; every
// int32 sum is exact and every float32 step is int8_products.h's, in its order, so
// each kernel gives the portable loop's bits.
//
// Up to kFewRows rows of x (decoding) the weights are read in place: one row of x as
// Bytes<S>::kStreams long streams of weight rows side by side, four groups of 64 of a
// row summed across their registers together and scaled in a register, the groups after
// the last whole four one at a time; more rows of x four weight rows at a time with
// software prefetches of the rows after next. More rows (prefill) repack the weights a
// panel of two registers of outputs at a time into 4-byte groups (one output a lane)
// and run tiles of Bytes<S>::kTileRows rows over them.

#include "kernels/cpu/int8_rows.h"

#include <torchattn/detail/kernels/cpu/simd.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace torchattn::kernels::cpu::int8 {

namespace {

TORCHATTN_SIMD_KERNELS_BEGIN

// The portable loop: the same integers and the same float32 steps as the kernels.
// Outputs [begin, end) of the part for every row.
void portable(const QuantizedRows& xr, int64_t rows, const Int8Call& c, int64_t begin, int64_t end) {
  for (int64_t o = begin; o < end; ++o) {
    for (int64_t m = 0; m < rows; ++m) {
      const uint8_t* xm = xr.bytes.data() + m * xr.padded_in;
      float acc = 0.0f;
      for (int64_t g = 0; g < xr.groups; ++g) {
        const int64_t g0 = g * kGroup, g1 = std::min(c.in, g0 + kGroup);
        int32_t d = 0;
        for (int64_t i = g0; i < g1; ++i) d += (static_cast<int32_t>(xm[i]) - 128) * c.q[o * c.in + i];
        const float t = static_cast<float>(d) * c.scale[o * xr.groups + g];
        acc = std::fma(t, xr.scale[m * xr.groups + g], acc);
      }
      c.y[m * c.ldy + o] = c.bias != nullptr ? acc + c.bias[o] : acc;
    }
  }
}

#if defined(TORCHATTN_SIMD_X86)
// The adapters' operations (inlined into the kernels' entry points, as simd.h's are).
TORCHATTN_SIMD_TARGETS_BEGIN
#define TORCHATTN_INT8_AVX2 __attribute__((target("avx2,fma,f16c"))) static
#define TORCHATTN_INT8_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni,fma,f16c"))) static

// How x's quantized bytes (QuantizedRows) meet the weights in the products of S, and
// the shapes of S's kernels: T the type whose operations run, X x's operand of one
// register, start(w) where the int32 sums over a register of weights w begin.
template <class S>
struct Bytes;

// AVX2: x as |qx| (mag) against the weights given qx's sign (sgn); the sums begin at 0.
template <>
struct Bytes<simd::Avx2> {
  using T = simd::Avx2;
  using I = T::I;
  static constexpr bool kSigns = true;     // x read as mag and sgn (prepare())
  static constexpr int64_t kTileRows = 4;  // rows of x per pass over a panel
  // The tile's 16 steps over a group unrolled whole (else one at a time): whole ran 25%
  // slower here (512 rows of x against 2048 x 2048 weights, an AMD EPYC Zen 5 capped to
  // AVX2; four at a time 3% slower), 3-5% faster with VNNI.
  static constexpr bool kWholeGroupSteps = false;
  // One row of x: four long streams of weight rows, the outputs split in four runs of m
  // and output j of each run summed together. A Llama-3.2-1B-shaped model's int8
  // weights (1141 MB a token, the kernel alone), a 2-core AMD EPYC Zen 3 (AVX2, no
  // VNNI), 5 interleaved rounds: 23.7 GB/s (21.3-27.7) against 20.6 (19.1-22.0) for one
  // prefetched stream at 2 threads; 13.3-15.9 against 12.0-12.5 at 1 thread. Four
  // streams with the prefetches too: 13.3-16.6 (2 threads).
  static constexpr int kStreams = 4;
  // A lone stream (an output left over) prefetches its weights this many bytes ahead.
  // Measured when every output went one stream this way, the same model and machine,
  // 2 threads, medians of 3-4 interleaved rounds: none 22.4 GB/s, 512 ahead 23.6, 1024
  // 24.0-25.1, 2048 22.8-25.7, 4096 23.0; 1 thread: none 12.8-15.0, 1024 16.6.
  static constexpr int64_t kAhead = 1024;
  struct X {
    I mag, sgn;
  };
  TORCHATTN_INT8_AVX2 X load(const QuantizedRows& xr, int64_t m, int64_t at) {
    const int64_t i = m * xr.padded_in + at;
    return {T::iload(xr.mag.data() + i), T::iload(xr.sgn.data() + i)};
  }
  TORCHATTN_INT8_AVX2 X broadcast(const QuantizedRows& xr, int64_t m, int64_t at) {
    const int64_t i = m * xr.padded_in + at;
    return {T::ibroadcast4(xr.mag.data() + i), T::ibroadcast4(xr.sgn.data() + i)};
  }
  TORCHATTN_INT8_AVX2 I start(I /*w*/) { return T::izero(); }
  TORCHATTN_INT8_AVX2 I dot(I acc, X x, I w) { return T::dot_signed(acc, x.mag, x.sgn, w); }
};

// AVX-512 without VNNI runs AVX2's products.
template <>
struct Bytes<simd::Avx512> : Bytes<simd::Avx2> {};

// VNNI: x as unsigned bytes qx + 128, so a sum over weights w begins at -128 * sum(w)
// (the excess taken back, by the instruction itself).
template <>
struct Bytes<simd::Avx512Vnni> {
  using T = simd::Avx512Vnni;
  using I = T::I;
  static constexpr bool kSigns = false;
  static constexpr int64_t kTileRows = 8;
  static constexpr bool kWholeGroupSteps = true;
  // One row of x: one weight row at a time, one stream that the hardware prefetchers
  // follow (123.6 against 101.6 tokens/s with software prefetches, SmolLM2-135M int8
  // on a 2-core AMD EPYC; a software prefetch 8 KiB down the one stream gained nothing
  // on an AMD EPYC Zen 5). Four long streams, as AVX2 reads them, ran at less than half
  // the rate on the Zen 5: a 1B model's int8 decoding at 16.4 against 34.4 tokens/s
  // (2 threads), 9.6 against 22.2 (1 thread).
  static constexpr int kStreams = 1;
  static constexpr int64_t kAhead = 0;
  using X = I;
  TORCHATTN_INT8_VNNI X load(const QuantizedRows& xr, int64_t m, int64_t at) {
    return T::iload(xr.bytes.data() + m * xr.padded_in + at);
  }
  TORCHATTN_INT8_VNNI X broadcast(const QuantizedRows& xr, int64_t m, int64_t at) {
    return T::ibroadcast4(xr.bytes.data() + m * xr.padded_in + at);
  }
  TORCHATTN_INT8_VNNI I start(I w) {
    const uint32_t excess = 0x80808080u;
    return T::isub(T::izero(), T::dot_unsigned(T::izero(), T::ibroadcast4(&excess), w));
  }
  TORCHATTN_INT8_VNNI I dot(I acc, X x, I w) { return T::dot_unsigned(acc, x, w); }
};

#undef TORCHATTN_INT8_AVX2
#undef TORCHATTN_INT8_VNNI
TORCHATTN_SIMD_TARGETS_END

// The int32 sums of one group of weights w (its first `left` inputs, zeros after; whole
// where left >= kGroup) against row m of x at `at`, begun at start().
template <class B>
void group_sums(const QuantizedRows& xr, int64_t m, int64_t at, const int8_t* w, int64_t left, typename B::I& out) {
  using T = typename B::T;
  constexpr int kBytes = T::kBytes;
  typename B::I acc = T::izero();
  for (int64_t h = 0; h < kGroup / kBytes; ++h) {
    const auto wv = left >= kGroup
                        ? T::iload(w + h * kBytes)
                        : T::iload(w + h * kBytes, static_cast<int>(std::clamp<int64_t>(left - h * kBytes, 0, kBytes)));
    acc = B::dot(T::iadd(acc, B::start(wv)), B::load(xr, m, at + h * kBytes), wv);
  }
  out = acc;
}

// One row of x, outputs [begin, end): kStreams long streams of weight rows side by side
// (the outputs split in kStreams runs, output j of each run summed together), the
// outputs left over one at a time. Each output's bits are those of one stream.
struct OneRow {
  template <class B, int R>
  static void rows(const QuantizedRows& xr, const Int8Call& c, const int64_t* o) {
    using T = typename B::T;
    using F = simd::Four;
    const int64_t groups = xr.groups, in = c.in;
    const int64_t quads = in / (4 * kGroup);  // whole groups, four at a time
    float acc[R] = {};
    for (int64_t q4 = 0; q4 < quads; ++q4) {
      const int64_t at = q4 * 4 * kGroup;
      const F::V xs = F::load(xr.scale.data() + q4 * 4);
      // Unrolled, so that the R streams' loads are in flight together.
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const int8_t* w = c.q + o[r] * in;
        if constexpr (R == 1 && B::kAhead > 0) {
          for (int j = 0; j < 4; ++j) __builtin_prefetch(w + at + B::kAhead + 64 * j);
        }
        typename B::I v[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) group_sums<B>(xr, 0, at + j * kGroup, w + at + j * kGroup, kGroup, v[j]);
        const F::V t = F::mul(F::to_float(T::sum_four(v[0], v[1], v[2], v[3])),
                              F::load(c.scale + o[r] * groups + q4 * 4));
        acc[r] = F::fma_in_order(t, xs, acc[r]);
      }
    }
    // The groups after the whole fours (a short last group among them) one at a time.
    for (int r = 0; r < R; ++r) {
      const int8_t* w = c.q + o[r] * in;
      const float* s = c.scale + o[r] * groups;
      float a = acc[r];
      for (int64_t g = quads * 4; g < groups; ++g) {
        typename B::I v;
        group_sums<B>(xr, 0, g * kGroup, w + g * kGroup, in - g * kGroup, v);
        a = std::fma(static_cast<float>(T::reduce_add(v)) * s[g], xr.scale[g], a);
      }
      c.y[o[r]] = c.bias != nullptr ? a + c.bias[o[r]] : a;
    }
  }
  template <class B>
  static void run(const QuantizedRows& xr, const Int8Call& c, int64_t begin, int64_t end) {
    constexpr int R = B::kStreams;
    const int64_t m = (end - begin) / R;
    if constexpr (R > 1) {
      for (int64_t j = 0; j < m; ++j) {
        int64_t o[R];
        for (int r = 0; r < R; ++r) o[r] = begin + j + r * m;
        rows<B, R>(xr, c, o);
      }
    }
    for (int64_t o = begin + (R > 1 ? R * m : 0); o < end; ++o) rows<B, 1>(xr, c, &o);
  }
};

// Two to kFewRows rows of x, outputs [begin, end): four weight rows at a time, each
// group's weights loaded once for every row of x, its int32 sums begun once.
struct FewRows {
  template <class B>
  static void run(const QuantizedRows& xr, int64_t rows, const Int8Call& c, int64_t begin, int64_t end) {
    using T = typename B::T;
    using I = typename B::I;
    using F = simd::Four;
    constexpr int kBytes = T::kBytes, kPer = kGroup / kBytes;
    const int64_t groups = xr.groups, in = c.in;
    alignas(16) float acc[kFewRows][4];
    for (int64_t o = begin; o < end; o += 4) {
      const int64_t n = std::min<int64_t>(4, end - o);
      const int8_t* w[4];
      const float* s[4];
      for (int64_t k = 0; k < 4; ++k) {
        const int64_t row = o + (k < n ? k : 0);
        w[k] = c.q + row * in;
        s[k] = c.scale + row * groups;
      }
      // The rows after next on their way from memory while these are summed.
      if (o + 12 <= end) {
        const char* ahead = reinterpret_cast<const char*>(c.q + (o + 8) * in);
        for (int64_t b = 0; b < 4 * in; b += 64) __builtin_prefetch(ahead + b);
      }
      for (int64_t m = 0; m < rows; ++m) F::store(acc[m], F::zero());
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t at = g * kGroup, left = in - at;
        I wv[4][kPer], start[4];
        for (int k = 0; k < 4; ++k) {
          start[k] = T::izero();
          for (int64_t h = 0; h < kPer; ++h) {
            wv[k][h] = left >= kGroup ? T::iload(w[k] + at + h * kBytes)
                                      : T::iload(w[k] + at + h * kBytes,
                                                 static_cast<int>(std::clamp<int64_t>(left - h * kBytes, 0, kBytes)));
            start[k] = T::iadd(start[k], B::start(wv[k][h]));
          }
        }
        const F::V sw = F::gather(s[0][g], s[1][g], s[2][g], s[3][g]);
        for (int64_t m = 0; m < rows; ++m) {
          typename B::X x[kPer];
          for (int64_t h = 0; h < kPer; ++h) x[h] = B::load(xr, m, at + h * kBytes);
          I v[4];
          for (int k = 0; k < 4; ++k) {
            v[k] = start[k];
            for (int h = 0; h < kPer; ++h) v[k] = B::dot(v[k], x[h], wv[k][h]);
          }
          const F::V t = F::mul(F::to_float(T::sum_four(v[0], v[1], v[2], v[3])), sw);
          F::store(acc[m], F::fma(t, F::set1(xr.scale[m * groups + g]), F::load(acc[m])));
        }
      }
      for (int64_t m = 0; m < rows; ++m) {
        for (int64_t k = 0; k < n; ++k) {
          c.y[m * c.ldy + o + k] = c.bias != nullptr ? acc[m][k] + c.bias[o + k] : acc[m][k];
        }
      }
    }
  }
};

#endif  // TORCHATTN_SIMD_X86

// At most kFewRows rows of x, outputs [begin, end) of the part, on this thread.
struct Rows {
  static constexpr Isa kWidest = Isa::Avx512Vnni;
  template <class S>
  static void run(const QuantizedRows& xr, int64_t rows, const Int8Call& c, int64_t begin, int64_t end) {
#if defined(TORCHATTN_SIMD_X86)
    if constexpr (S::kIsa != Isa::Scalar) {
      if (rows == 1) return OneRow::run<Bytes<S>>(xr, c, begin, end);
      return FewRows::run<Bytes<S>>(xr, rows, c, begin, end);
    }
#endif
    portable(xr, rows, c, begin, end);
  }
};

#if defined(TORCHATTN_SIMD_X86)
// A panel of 2 * T::W outputs [o0, o0 + kPanel) in 4-byte groups:
// words[(k / 4) * kPanel + j] = q[o0 + j, k .. k + 4) (zeros past `out` and past `in`),
// where each group's int32 sums begin ([groups, kPanel], Bytes::start) and the scales
// ([groups, kPanel], zeros past `out`).
struct Panel {
  std::vector<int32_t> words;
  std::vector<int32_t> start;
  std::vector<float> scale;
};

template <class S>
constexpr int64_t panel_width() {
  if constexpr (S::kIsa == Isa::Scalar) {
    return 1;
  } else {
    return 2 * Bytes<S>::T::W;
  }
}

struct Repack {
  static constexpr Isa kWidest = Isa::Avx512Vnni;
  template <class S>
  static void run(const Int8Call& c, int64_t groups, int64_t o0, Panel& p) {
    using B = Bytes<S>;
    using T = typename B::T;
    constexpr int64_t kPanel = panel_width<S>(), W = T::W;
    const int64_t quads = groups * kGroup / 4, whole = c.in / 4;
    p.words.assign(static_cast<size_t>(quads * kPanel), 0);
    p.start.assign(static_cast<size_t>(groups * kPanel), 0);
    p.scale.assign(static_cast<size_t>(groups * kPanel), 0.0f);
    int32_t* words = p.words.data();
    for (int64_t j = 0; j < kPanel && o0 + j < c.out; ++j) {
      const int8_t* row = c.q + (o0 + j) * c.in;
      int64_t k4 = 0;
      for (; k4 < whole; ++k4) std::memcpy(words + k4 * kPanel + j, row + k4 * 4, 4);
      if (k4 * 4 < c.in) {
        int8_t four[4] = {0, 0, 0, 0};
        std::memcpy(four, row + k4 * 4, static_cast<size_t>(c.in - k4 * 4));
        std::memcpy(words + k4 * kPanel + j, four, 4);
      }
      for (int64_t g = 0; g < groups; ++g) p.scale[g * kPanel + j] = c.scale[(o0 + j) * groups + g];
    }
    if constexpr (!B::kSigns) {
      for (int64_t g = 0; g < groups; ++g) {
        for (int64_t half = 0; half < 2; ++half) {
          typename B::I s = T::izero();
          for (int64_t kq = 0; kq < kGroup / 4; ++kq) {
            s = T::iadd(s, B::start(T::iload(words + (g * kGroup / 4 + kq) * kPanel + half * W)));
          }
          std::memcpy(p.start.data() + g * kPanel + half * W, &s, sizeof s);
        }
      }
    }
  }
};

// Rows [m0, m0 + kTileRows) x the panel's outputs into acc ([kTileRows, kPanel]
// floats): each group's int32 sums in registers, then scaled into the float32 sums.
struct Tile {
  static constexpr Isa kWidest = Isa::Avx512Vnni;
  template <class S>
  static void run(const QuantizedRows& xr, const Panel& p, int64_t m0, float* acc) {
    using B = Bytes<S>;
    using T = typename B::T;
    using I = typename B::I;
    constexpr int64_t kRows = B::kTileRows, kPanel = panel_width<S>(), W = T::W;
    const int64_t groups = xr.groups;
    for (int64_t i = 0; i < kRows * kPanel; i += W) T::store(acc + i, T::zero());
    static_assert(kRows == 4 || kRows == 8, "a tile of 4 or 8 rows");
    for (int64_t g = 0; g < groups; ++g) {
      const I c0 = T::iload(p.start.data() + g * kPanel), c1 = T::iload(p.start.data() + g * kPanel + W);
      // Named accumulators (GCC keeps an array of them in registers less well: 14% slower
      // with VNNI, 512 rows of x against 2048 x 2048 weights on an AMD EPYC Zen 5).
      I d00 = c0, d01 = c1, d10 = c0, d11 = c1, d20 = c0, d21 = c1, d30 = c0, d31 = c1;
      I d40 = c0, d41 = c1, d50 = c0, d51 = c1, d60 = c0, d61 = c1, d70 = c0, d71 = c1;
      const int32_t* wg = p.words.data() + g * kGroup / 4 * kPanel;
      const int64_t k0 = g * kGroup;
#define TORCHATTN_INT8_ROW(r)                              \
  {                                                        \
    const typename B::X x = B::broadcast(xr, m0 + (r), k); \
    d##r##0 = B::dot(d##r##0, x, w0);                      \
    d##r##1 = B::dot(d##r##1, x, w1);                      \
  }
#define TORCHATTN_INT8_STEP(kq)                                                       \
  {                                                                                   \
    const int64_t k = k0 + (kq) * 4;                                                  \
    const I w0 = T::iload(wg + (kq) * kPanel), w1 = T::iload(wg + (kq) * kPanel + W); \
    TORCHATTN_INT8_ROW(0)                                                             \
    TORCHATTN_INT8_ROW(1)                                                             \
    TORCHATTN_INT8_ROW(2)                                                             \
    TORCHATTN_INT8_ROW(3)                                                             \
    if constexpr (kRows == 8) {                                                       \
      TORCHATTN_INT8_ROW(4)                                                           \
      TORCHATTN_INT8_ROW(5)                                                           \
      TORCHATTN_INT8_ROW(6)                                                           \
      TORCHATTN_INT8_ROW(7)                                                           \
    }                                                                                 \
  }
      if constexpr (B::kWholeGroupSteps) {
#pragma GCC unroll 16
        for (int64_t kq = 0; kq < kGroup / 4; ++kq) TORCHATTN_INT8_STEP(kq)
      } else {
#pragma GCC unroll 1
        for (int64_t kq = 0; kq < kGroup / 4; ++kq) TORCHATTN_INT8_STEP(kq)
      }
#undef TORCHATTN_INT8_STEP
#undef TORCHATTN_INT8_ROW
      const I d[8][2] = {{d00, d01}, {d10, d11}, {d20, d21}, {d30, d31},
                         {d40, d41}, {d50, d51}, {d60, d61}, {d70, d71}};
      const auto s0 = T::load(p.scale.data() + g * kPanel), s1 = T::load(p.scale.data() + g * kPanel + W);
#pragma GCC unroll 8
      for (int64_t r = 0; r < kRows; ++r) {
        const auto sx = T::set1(xr.scale[(m0 + r) * groups + g]);
        float* a = acc + r * kPanel;
        T::store(a, T::fma(T::mul(T::to_float(d[r][0]), s0), sx, T::load(a)));
        T::store(a + W, T::fma(T::mul(T::to_float(d[r][1]), s1), sx, T::load(a + W)));
      }
    }
  }
};

// Every output of part c for `rows` rows of x over S's panels.
template <class S>
void panels_as(const QuantizedRows& xr, int64_t rows, const Int8Call& c) {
  run_panels<panel_width<S>(), Bytes<S>::kTileRows, Panel>(
      c, rows, [&](int64_t o0, Panel& p) { simd::run_as<S, Repack>(c, xr.groups, o0, p); },
      [&](const Panel& p, int64_t m0, float* acc) { simd::run_as<S, Tile>(xr, p, m0, acc); });
}
#endif  // TORCHATTN_SIMD_X86

// AVX2's operands: qx (the bytes less 128) and |qx| (a loop the compiler vectorizes
// with the instructions of S's target).
struct Signs {
  static constexpr Isa kWidest = Isa::Avx2;
  template <class S>
  static void run(QuantizedRows& xr) {
    const size_t n = xr.bytes.size();
    const uint8_t* bytes = xr.bytes.data();
    uint8_t* mag = xr.mag.data();
    int8_t* sgn = xr.sgn.data();
    for (size_t i = 0; i < n; ++i) {
      const auto q = static_cast<int8_t>(bytes[i] ^ 0x80u);
      sgn[i] = q;
      mag[i] = static_cast<uint8_t>(q < 0 ? -q : q);
    }
  }
};


TORCHATTN_SIMD_KERNELS_END

}  // namespace

void prepare(Isa isa, QuantizedRows& xr) {
  if (isa == Isa::Scalar || isa >= Isa::Avx512Vnni) return;
  xr.mag.resize(xr.bytes.size());
  xr.sgn.resize(xr.bytes.size());
  simd::run_on<Signs>(isa, xr);
}

void kernel_rows(Isa isa, const QuantizedRows& xr, int64_t rows, const Int8Call& c, int64_t begin, int64_t end) {
  simd::run_on<Rows>(isa, xr, rows, c, begin, end);
}

void kernel_panels(Isa isa, const QuantizedRows& xr, int64_t rows, const Int8Call& c) {
#if defined(TORCHATTN_SIMD_X86)
  if (isa >= Isa::Avx512Vnni) return panels_as<simd::Avx512Vnni>(xr, rows, c);
  if (isa >= Isa::Avx512) return panels_as<simd::Avx512>(xr, rows, c);
  if (isa >= Isa::Avx2) return panels_as<simd::Avx2>(xr, rows, c);
#endif
  at::parallel_for(0, c.out, 1, [&](int64_t b, int64_t e) { portable(xr, rows, c, b, e); });
}

}  // namespace torchattn::kernels::cpu::int8

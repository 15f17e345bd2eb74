#include "kernels/cpu/paged_attention.h"

#include "kernels/cpu/needs_grad.h"
#include "kernels/cpu/stall_aware.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__x86_64__) || defined(__i386__)
#define TORCHATTN_PAGED_X86 1
#include <immintrin.h>
#endif

// One task is a sequence's key head and a block of up to 8 of its new rows, times the
// G query heads that share that key head (R rows); tasks are cut into parts of equal
// work for the threads. The algorithm, for each task:
//   1. scores: for each block of keys, W keys at a time (the block's keys are
//      transposed, [d, block_size], so a lane is a key): acc += q[c] * k[c][lanes] over
//      c in order, for a tile of 4 rows times KT key vectors; times the scale; then
//      softcap * tanh(s / softcap) and + slope * (key - position) where asked; -inf
//      where the row does not see the key (past its position, before its window);
//   2. softmax numerators: p = exp(s - max) (0 where s is -inf), and their sum, W lanes
//      at a time from key 0; with a sink, the max takes it in and the sum its exp;
//   3. out = sum_j p_j v_j / sum over j in order, for a tile of 4 rows times CT vectors
//      of W output features.
// A row's operations and their order depend only on its own query, position and
// keys, never on the rows beside it, the number of rows or the tiles (a task that
// stops at fewer keys drops only terms that are exactly zero).

namespace torchattn::kernels::cpu {

namespace {

// Multiply-adds below which the step runs on the calling thread (see
// decode_attention: a parallel region costs more than small work).
constexpr int64_t kPagedSerialWork = 1 << 18;

// New rows of one sequence per task (times the query heads of a key head).
constexpr int64_t kRowBlock = 8;

struct Task {
  const float* q;         // row 0, query head hk * G
  int64_t q_row, q_head;  // strides between rows and between the G heads
  float* out;
  int64_t out_row, out_head;
  int64_t rows, groups, keys, dim, block_size, window;  // window 0: none
  float scale;
  float softcap;                     // 0: none
  const float* slopes;               // ALiBi: G slopes from the task's first query head; null: none
  const float* sinks;                // G sink logits from the task's first query head; null: none
  const float* const* key_blocks;    // [keys / block_size] blocks of [dim, block_size]
  const float* const* value_blocks;  // [keys / block_size] blocks of [block_size, dim]
};

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---- scalar: one lane ----
struct Scalar {
  using V = float;
  static constexpr int W = 1;
  static constexpr int KT = 4, CT = 4;  // key vectors and output vectors per tile
  static V zero() { return 0.0f; }
  static V set1(float x) { return x; }
  static V load(const float* p, int) { return *p; }
  static V load_pad(const float* p, int) { return *p; }
  static void store(float* p, V v, int) { *p = v; }
  static V fma(V a, V b, V c) { return std::fma(a, b, c); }
  static V mul(V a, V b) { return a * b; }
  static V add(V a, V b) { return a + b; }
  static V max(V a, V b) { return a > b ? a : b; }
  static float reduce_add(V v) { return v; }
  static float reduce_max(V v) { return v; }
  static V visible(V s, int64_t j, int64_t lo, int64_t hi) { return j < lo || j > hi ? kNegInf : s; }
  static V exp_shifted(V x, V m) { return x == kNegInf ? 0.0f : std::exp(x - m); }
  static V softcap(V s, float cap) { return std::tanh(s / cap) * cap; }
  static V alibi(V s, float slope, int64_t j, int64_t position) { return s + slope * static_cast<float>(j - position); }
};

#define PA_ISA Scalar
#define PA_TARGET inline
#define PA_ROWS rows_scalar
#include "kernels/cpu/paged_attention_rows.inc"
#undef PA_ISA
#undef PA_TARGET
#undef PA_ROWS

#if defined(TORCHATTN_PAGED_X86)
// GCC's AVX-512 headers pass _mm512_undefined_* through some intrinsics (roundscale,
// scalef, extract), which its -Wmaybe-uninitialized reports once per inlining.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// exp(x) for x <= 0 (Cephes' polynomial on x - n ln 2, then * 2^n): within 2 ulp.
#define PA_EXP_POLY(I, x)                                                                  \
  const auto n = I::round(I::mul(x, I::set1(1.44269504088896341f)));                       \
  const auto r = I::fma(n, I::set1(2.12194440e-4f), I::fma(n, I::set1(-0.693359375f), x)); \
  auto y = I::set1(1.9875691500e-4f);                                                      \
  y = I::fma(y, r, I::set1(1.3981999507e-3f));                                             \
  y = I::fma(y, r, I::set1(8.3334519073e-3f));                                             \
  y = I::fma(y, r, I::set1(4.1665795894e-2f));                                             \
  y = I::fma(y, r, I::set1(1.6666665459e-1f));                                             \
  y = I::fma(y, r, I::set1(5.0000001201e-1f));                                             \
  y = I::fma(y, I::mul(r, r), I::add(r, I::set1(1.0f)));

// cap * tanh(s / cap) (Cephes' tanhf: an odd polynomial below |x| = 0.625, else
// 1 - 2 / (exp(2|x|) + 1) written with e = exp(-2|x|)), within a few ulp.
#define PA_SOFTCAP(I, s, cap)                                                                     \
  const auto x = I::div(s, I::set1(cap));                                                         \
  const auto a = I::abs(x);                                                                       \
  const auto z = I::mul(x, x);                                                                    \
  auto small = I::set1(-5.70498872745e-3f);                                                       \
  small = I::fma(small, z, I::set1(2.06390887954e-2f));                                           \
  small = I::fma(small, z, I::set1(-5.37397155531e-2f));                                          \
  small = I::fma(small, z, I::set1(1.33314422036e-1f));                                           \
  small = I::fma(small, z, I::set1(-3.33332819422e-1f));                                          \
  small = I::fma(I::mul(small, z), x, x);                                                         \
  const auto e = I::exp_neg(I::mul(a, I::set1(-2.0f)));                                           \
  const auto large = I::with_sign(I::div(I::sub(I::set1(1.0f), e), I::add(I::set1(1.0f), e)), x); \
  return I::mul(I::below(a, 0.625f, small, large), I::set1(cap));

// ---- AVX2 + FMA: 8 lanes ----
#define PA_AVX2 __attribute__((target("avx2,fma"), always_inline)) static inline
struct Avx2 {
  using V = __m256;
  static constexpr int W = 8;
  static constexpr int KT = 2, CT = 2;  // 16 registers: 4 rows x 2 accumulators, loads
  PA_AVX2 __m256i lanes_below(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  PA_AVX2 V zero() { return _mm256_setzero_ps(); }
  PA_AVX2 V set1(float x) { return _mm256_set1_ps(x); }
  PA_AVX2 V load(const float* p, int n) { return n == W ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lanes_below(n)); }
  PA_AVX2 V load_pad(const float* p, int n) {
    return n == W ? _mm256_loadu_ps(p)
                  : _mm256_blendv_ps(_mm256_set1_ps(kNegInf), _mm256_maskload_ps(p, lanes_below(n)),
                                     _mm256_castsi256_ps(lanes_below(n)));
  }
  PA_AVX2 void store(float* p, V v, int n) {
    if (n == W) {
      _mm256_storeu_ps(p, v);
    } else {
      _mm256_maskstore_ps(p, lanes_below(n), v);
    }
  }
  PA_AVX2 V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  PA_AVX2 V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  PA_AVX2 V add(V a, V b) { return _mm256_add_ps(a, b); }
  PA_AVX2 V max(V a, V b) { return _mm256_max_ps(a, b); }
  PA_AVX2 V round(V a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  PA_AVX2 float reduce_add(V v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
  }
  PA_AVX2 float reduce_max(V v) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
  }
  PA_AVX2 V visible(V s, int64_t j0, int64_t lo, int64_t hi) {
    const __m256i j = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(j0)),
                                       _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i out = _mm256_or_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(lo)), j),
                                        _mm256_cmpgt_epi32(j, _mm256_set1_epi32(static_cast<int>(hi))));
    return _mm256_blendv_ps(s, _mm256_set1_ps(kNegInf), _mm256_castsi256_ps(out));
  }
  PA_AVX2 V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  PA_AVX2 V div(V a, V b) { return _mm256_div_ps(a, b); }
  PA_AVX2 V abs(V a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
  PA_AVX2 V with_sign(V magnitude, V sign) {
    return _mm256_or_ps(magnitude, _mm256_and_ps(sign, _mm256_set1_ps(-0.0f)));
  }
  PA_AVX2 V below(V a, float bound, V yes, V no) {
    return _mm256_blendv_ps(no, yes, _mm256_cmp_ps(a, _mm256_set1_ps(bound), _CMP_LT_OQ));
  }
  // exp(x) for x <= 0, x clamped at -87.
  PA_AVX2 V exp_neg(V x_in) {
    const V x = _mm256_max_ps(x_in, _mm256_set1_ps(-87.0f));
    PA_EXP_POLY(Avx2, x)
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  }
  PA_AVX2 V exp_shifted(V s, V m) {
    const V p = exp_neg(_mm256_sub_ps(s, m));
    return _mm256_andnot_ps(_mm256_cmp_ps(s, _mm256_set1_ps(kNegInf), _CMP_EQ_OQ), p);
  }
  PA_AVX2 V softcap(V s, float cap){PA_SOFTCAP(Avx2, s, cap)} PA_AVX2 V
      alibi(V s, float slope, int64_t j0, int64_t position) {
    const __m256i j = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(j0 - position)),
                                       _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_add_ps(s, _mm256_mul_ps(_mm256_set1_ps(slope), _mm256_cvtepi32_ps(j)));
  }
};

#define PA_ISA Avx2
#define PA_TARGET __attribute__((target("avx2,fma")))
#define PA_ROWS rows_avx2
#include "kernels/cpu/paged_attention_rows.inc"
#undef PA_ISA
#undef PA_TARGET
#undef PA_ROWS

// ---- AVX-512F: 16 lanes ----
#define PA_AVX512 __attribute__((target("avx512f,fma"), always_inline)) static inline
struct Avx512 {
  using V = __m512;
  static constexpr int W = 16;
  static constexpr int KT = 3, CT = 4;  // 32 registers
  PA_AVX512 __mmask16 lanes_below(int n) { return static_cast<__mmask16>((1u << n) - 1u); }
  PA_AVX512 V zero() { return _mm512_setzero_ps(); }
  PA_AVX512 V set1(float x) { return _mm512_set1_ps(x); }
  PA_AVX512 V load(const float* p, int n) {
    return n == W ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(lanes_below(n), p);
  }
  PA_AVX512 V load_pad(const float* p, int n) {
    return n == W ? _mm512_loadu_ps(p) : _mm512_mask_loadu_ps(_mm512_set1_ps(kNegInf), lanes_below(n), p);
  }
  PA_AVX512 void store(float* p, V v, int n) {
    if (n == W) {
      _mm512_storeu_ps(p, v);
    } else {
      _mm512_mask_storeu_ps(p, lanes_below(n), v);
    }
  }
  PA_AVX512 V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  PA_AVX512 V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  PA_AVX512 V add(V a, V b) { return _mm512_add_ps(a, b); }
  PA_AVX512 V max(V a, V b) { return _mm512_max_ps(a, b); }
  PA_AVX512 V round(V a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  PA_AVX512 float reduce_add(V v) {
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v),
                                   _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    return Avx2::reduce_add(h);
  }
  PA_AVX512 float reduce_max(V v) {
    const __m256 h = _mm256_max_ps(_mm512_castps512_ps256(v),
                                   _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    return Avx2::reduce_max(h);
  }
  PA_AVX512 V visible(V s, int64_t j0, int64_t lo, int64_t hi) {
    const __m512i j = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(j0)),
                                       _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    const __mmask16 in = _mm512_cmpge_epi32_mask(j, _mm512_set1_epi32(static_cast<int>(lo))) &
                         _mm512_cmple_epi32_mask(j, _mm512_set1_epi32(static_cast<int>(hi)));
    return _mm512_mask_blend_ps(in, _mm512_set1_ps(kNegInf), s);
  }
  PA_AVX512 V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  PA_AVX512 V div(V a, V b) { return _mm512_div_ps(a, b); }
  PA_AVX512 V abs(V a) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a), _mm512_set1_epi32(0x7fffffff)));
  }
  PA_AVX512 V with_sign(V magnitude, V sign) {
    const __m512i bit = _mm512_and_si512(_mm512_castps_si512(sign), _mm512_set1_epi32(static_cast<int>(0x80000000u)));
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(magnitude), bit));
  }
  PA_AVX512 V below(V a, float bound, V yes, V no) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, _mm512_set1_ps(bound), _CMP_LT_OQ), no, yes);
  }
  // exp(x) for x <= 0, x clamped at -87.
  PA_AVX512 V exp_neg(V x_in) {
    const V x = _mm512_max_ps(x_in, _mm512_set1_ps(-87.0f));
    PA_EXP_POLY(Avx512, x)
    return _mm512_scalef_ps(y, n);
  }
  PA_AVX512 V exp_shifted(V s, V m) {
    const __mmask16 finite = _mm512_cmp_ps_mask(s, _mm512_set1_ps(kNegInf), _CMP_NEQ_OQ);
    return _mm512_maskz_mov_ps(finite, exp_neg(_mm512_sub_ps(s, m)));
  }
  PA_AVX512 V softcap(V s, float cap){PA_SOFTCAP(Avx512, s, cap)} PA_AVX512 V
      alibi(V s, float slope, int64_t j0, int64_t position) {
    const __m512i j = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(j0 - position)),
                                       _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    return _mm512_add_ps(s, _mm512_mul_ps(_mm512_set1_ps(slope), _mm512_maskz_cvtepi32_ps(0xFFFF, j)));
  }
};

#define PA_ISA Avx512
#define PA_TARGET __attribute__((target("avx512f,fma")))
#define PA_ROWS rows_avx512
#include "kernels/cpu/paged_attention_rows.inc"
#undef PA_ISA
#undef PA_TARGET
#undef PA_ROWS
#undef PA_EXP_POLY
#undef PA_SOFTCAP
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

using RowsFn = void (*)(const Task&, float*);

bool has_avx512() {
#if defined(TORCHATTN_PAGED_X86)
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
#else
  return false;
#endif
}

bool has_avx2_fma() {
#if defined(TORCHATTN_PAGED_X86)
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
#else
  return false;
#endif
}

RowsFn rows_kernel(PagedIsa isa) {
#if defined(TORCHATTN_PAGED_X86)
  if (isa == PagedIsa::Avx512) return rows_avx512;
  if (isa == PagedIsa::Avx2) return rows_avx2;
#endif
  return rows_scalar;
}

bool plain_float(const at::Tensor& t, int64_t dim) {
  return t.is_cpu() && t.scalar_type() == at::kFloat && t.layout() == at::kStrided && !t.is_nested() &&
         t.dim() == dim && t.stride(dim - 1) == 1 && !needs_grad(t);
}

}  // namespace

std::vector<PagedIsa> paged_isas() {
  std::vector<PagedIsa> out{PagedIsa::Scalar};
  if (has_avx2_fma()) out.push_back(PagedIsa::Avx2);
  if (has_avx512()) out.push_back(PagedIsa::Avx512);
  return out;
}

bool paged_attention_applies(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values) {
  if (!plain_float(q, 3) || !plain_float(keys, 4) || !plain_float(values, 4)) return false;
  if (!keys.is_contiguous() || !values.is_contiguous()) return false;
  const int64_t H = q.size(1), d = q.size(2), nb = keys.size(0), Hkv = keys.size(1), bs = keys.size(3);
  const bool shapes = keys.size(2) == d && values.size(0) == nb && values.size(1) == Hkv && values.size(2) == bs &&
                      values.size(3) == d;
  return shapes && Hkv >= 1 && H % Hkv == 0 && d >= 1 && bs >= 1 &&
         nb * bs <= std::numeric_limits<int32_t>::max();  // lanes compare key indices as int32
}

void paged_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values, const PagedRows& r,
                     const std::vector<int64_t>& which, double scale, at::Tensor& out, std::optional<PagedIsa> isa,
                     const PagedScores& extra) {
  TORCH_CHECK(!extra.softcap || (*extra.softcap > 0.0 && std::isfinite(*extra.softcap)),
              "paged_attention: expected softcap > 0, got ", extra.softcap.value_or(0.0));
  TORCH_CHECK(paged_attention_applies(q, keys, values),
              "paged_attention: expected float32 CPU q [N, H, d], "
              "contiguous keys [blocks, Hkv, d, block_size] and values [blocks, Hkv, block_size, d], H a multiple of "
              "Hkv, and no gradient");
  TORCH_CHECK(out.is_contiguous() && out.sizes() == q.sizes() && out.scalar_type() == at::kFloat,
              "paged_attention: expected a contiguous float32 out of q's shape ", q.sizes(), ", got ", out.sizes());
  const int64_t H = q.size(1), d = q.size(2), Hkv = keys.size(1), G = H / Hkv, bs = keys.size(3);
  const auto& qs = *r.query_start;
  const auto& ks = *r.key_start;
  for (const int64_t s : which) {
    TORCH_CHECK(qs[s + 1] - qs[s] >= 1 && qs[s + 1] - qs[s] <= kPagedKernelRows, "paged_attention: sequence ", s,
                " brings ", qs[s + 1] - qs[s], " rows; the kernel takes 1 to ", kPagedKernelRows);
    TORCH_CHECK(ks[s + 1] - ks[s] >= qs[s + 1] - qs[s], "paged_attention: sequence ", s, " has fewer keys (",
                ks[s + 1] - ks[s], ") than new rows (", qs[s + 1] - qs[s], ")");
  }
  const float* qp = q.const_data_ptr<float>();
  const float* kp = keys.const_data_ptr<float>();
  const float* vp = values.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  const int64_t block_floats = Hkv * d * bs;  // one block of one layer, keys or values
  const auto isas = paged_isas();
  TORCH_CHECK(!isa || std::find(isas.begin(), isas.end(), *isa) != isas.end(),
              "paged_attention: this CPU does not run the instructions asked for");
  const RowsFn rows_fn = rows_kernel(isa.value_or(isas.back()));

  // Tasks: a sequence's key head and a block of at most kRowBlock of its new rows (the
  // rows r0 .. r1 of n see at most the first L - n + r1 keys). Cut by rows, a long
  // chunk spreads over the threads; each row's arithmetic stays its own.
  struct Piece {
    int64_t s, hk, r0, r1;
  };
  std::vector<Piece> pieces;
  std::vector<int64_t> work_before{0};  // prefix sums of the pieces' multiply-adds
  for (const int64_t s : which) {
    const int64_t n = qs[s + 1] - qs[s], L = ks[s + 1] - ks[s];
    for (int64_t hk = 0; hk < Hkv; ++hk) {
      for (int64_t r0 = 0; r0 < n; r0 += kRowBlock) {
        const int64_t r1 = std::min(n, r0 + kRowBlock);
        pieces.push_back({s, hk, r0, r1});
        work_before.push_back(work_before.back() + (r1 - r0) * G * (L - n + r1) * 2 * d);
      }
    }
  }
  auto run = [&](int64_t begin, int64_t end) {
    std::vector<const float*> key_blocks, value_blocks;
    std::vector<float> scratch;
    for (int64_t i = begin; i < end; ++i) {
      const Piece& p = pieces[static_cast<size_t>(i)];
      const int64_t n = qs[p.s + 1] - qs[p.s];
      const int64_t rows = p.r1 - p.r0, L = ks[p.s + 1] - ks[p.s] - n + p.r1;
      const int64_t* slots = r.key_slots + ks[p.s];
      key_blocks.clear();
      value_blocks.clear();
      for (int64_t j = 0; j < L; j += bs) {
        const int64_t block = slots[j] / bs;
        key_blocks.push_back(kp + block * block_floats + p.hk * d * bs);
        value_blocks.push_back(vp + block * block_floats + p.hk * bs * d);
      }
      scratch.resize(static_cast<size_t>(rows * G * (L + 1)));
      const int64_t row = qs[p.s] + p.r0;
      const Task t{qp + row * q.stride(0) + p.hk * G * q.stride(1),
                   q.stride(0),
                   q.stride(1),
                   op + (row * H + p.hk * G) * d,
                   H * d,
                   d,
                   rows,
                   G,
                   L,
                   d,
                   bs,
                   r.window.value_or(0),
                   static_cast<float>(scale),
                   static_cast<float>(extra.softcap.value_or(0.0)),
                   extra.alibi_slopes != nullptr ? extra.alibi_slopes + p.hk * G : nullptr,
                   extra.sinks != nullptr ? extra.sinks + p.hk * G : nullptr,
                   key_blocks.data(),
                   value_blocks.data()};
      rows_fn(t, scratch.data());
    }
  };
  const int64_t n_pieces = static_cast<int64_t>(pieces.size());
  const int64_t total = work_before.back();
  if (total <= kPagedSerialWork || n_pieces == 1) {
    run(0, n_pieces);
    return;
  }
  // The pieces cut into parts of about equal work (a long chunk's pieces weigh more
  // than a decoding token's), a few per thread.
  const int64_t n_parts = std::min<int64_t>(n_pieces, 4 * std::max(1, at::get_num_threads()));
  std::vector<int64_t> bounds{0};
  for (int64_t k = 1; k < n_parts; ++k) {
    const int64_t target = total * k / n_parts;
    const auto at_work = std::lower_bound(work_before.begin(), work_before.end(), target);
    const int64_t cut = std::max(bounds.back(), static_cast<int64_t>(at_work - work_before.begin()));
    if (cut > bounds.back() && cut < n_pieces) bounds.push_back(cut);
  }
  bounds.push_back(n_pieces);
  parallel_for_unless_stalled(static_cast<int64_t>(bounds.size()) - 1, 1, [&](int64_t begin, int64_t end) {
    run(bounds[static_cast<size_t>(begin)], bounds[static_cast<size_t>(end)]);
  });
}

}  // namespace torchattn::kernels::cpu

#include "kernels/cpu/prefill_attention.h"

#include "kernels/cpu/float_operand.h"
#include "kernels/cpu/needs_grad.h"
#include <torchattn/detail/kernels/cpu/row_softmax.h>
#include <torchattn/detail/kernels/cpu/simd.h>
#include "kernels/cpu/stall_aware.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace torchattn::kernels::cpu {

namespace {

// Keys are packed transposed, [B, Hkv, d, TkP], TkP a multiple of the widest tile's
// keys (zeros past Tk), so every tile loads whole vectors.
constexpr int64_t kKeyPad = 32;

// One call's operands: q rows, the packed keys, v rows, the output.
struct Operands {
  const float* q;
  int64_t q_b, q_h, q_t;
  const float* kt;  // [B, Hkv, d, TkP], contiguous
  const float* v;
  int64_t v_b, v_h, v_t;
  float* out;  // [B, H, Tq, dv], contiguous
  int64_t H, G, Tq, Tk, TkP, d, dv, offset;
  float scale;
};

TORCHATTN_SIMD_KERNELS_BEGIN

// Query rows of a block (and of a score tile) for the vector type S.
template <class S>
constexpr int64_t block_rows() {
  return S::W == 16 ? 8 : 4;
}

struct BlockRows {
  static constexpr Isa kWidest = Isa::Avx512;
  template <class S>
  static int64_t run() {
    return block_rows<S>();
  }
};

// Blocks [begin, end) of the flattened (batch, head, block of rows) index. Within a
// head the blocks run in zigzag order (first, last, second, ...), so that a contiguous
// split of the index gives each thread as many keys as another.
struct CausalBlocks {
  static constexpr Isa kWidest = Isa::Avx512;

  template <class S>
  static void run(const Operands& a, int64_t begin, int64_t end) {
    using V = typename S::V;
    constexpr int W = S::W;
    // Score tiles: R rows x NK vectors of keys; output tiles: RO rows x NO vectors of
    // columns (AVX-512: 16 and 16 accumulators of its 32 registers; AVX2: 8 of 16).
    constexpr int64_t R = block_rows<S>(), NK = 2, KT = NK * W;
    constexpr int64_t RO = W == 16 ? 4 : 2, NO = 4;
    static_assert(kKeyPad % KT == 0, "packed keys must hold whole tiles");
    const int64_t blocks = (a.Tq + R - 1) / R;
    std::vector<float> scratch(R * a.TkP);
    float inv[R];
    const V vscale = S::set1(a.scale);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bh = task / blocks, p = task % blocks;
      const int64_t block = p % 2 == 0 ? p / 2 : blocks - 1 - p / 2;
      const int64_t b = bh / a.H, h = bh % a.H, hk = h / a.G;
      const int64_t t0 = block * R, rows = std::min(R, a.Tq - t0);
      const int64_t keys = t0 + rows + a.offset;  // seen by the block's last row
      const float* qb = a.q + b * a.q_b + h * a.q_h;
      const float* kt = a.kt + (b * (a.H / a.G) + hk) * a.d * a.TkP;
      const float* vb = a.v + b * a.v_b + hk * a.v_h;
      // Rows past the block's last compute a copy of it, not stored.
      const float* qrow[R];
      for (int64_t r = 0; r < R; ++r) qrow[r] = qb + (t0 + std::min(r, rows - 1)) * a.q_t;

      // 1. Scores of the keys the block sees, whole tiles, times the scale.
      for (int64_t j0 = 0; j0 < keys; j0 += KT) {
        V acc[R][NK];
        for (auto& row : acc) {
          for (auto& x : row) x = S::zero();
        }
        const float* kc = kt + j0;
        for (int64_t i = 0; i < a.d; ++i, kc += a.TkP) {
          V kv[NK];
          for (int64_t n = 0; n < NK; ++n) kv[n] = S::load(kc + n * W);
          for (int64_t r = 0; r < R; ++r) {
            const V qv = S::set1(qrow[r][i]);
            for (int64_t n = 0; n < NK; ++n) acc[r][n] = S::fma(qv, kv[n], acc[r][n]);
          }
        }
        for (int64_t r = 0; r < R; ++r) {
          for (int64_t n = 0; n < NK; ++n) S::store(scratch.data() + r * a.TkP + j0 + n * W, S::mul(acc[r][n], vscale));
        }
      }

      // 2. Each row's softmax over its visible keys, exp(s - max) unnormalized
      //    (RowSoftmax, the row's keys one block).
      for (int64_t r = 0; r < rows; ++r) {
        RowSoftmax<S> row;
        row.add(scratch.data() + r * a.TkP, t0 + r + a.offset + 1);
        inv[r] = row.inverse();
      }

      // 3. The weighted values, RO rows x NO vectors of columns at a time.
      for (int64_t r0 = 0; r0 < rows; r0 += RO) {
        const float* prow[RO];
        for (int64_t r = 0; r < RO; ++r) prow[r] = scratch.data() + std::min(r0 + r, rows - 1) * a.TkP;
        // Rows stored by this group, and the keys all of them see (its first row's).
        const int64_t stored = std::min(RO, rows - r0), shared = t0 + r0 + a.offset + 1;
        for (int64_t c0 = 0; c0 < a.dv; c0 += NO * W) {
          const int64_t nv = std::min<int64_t>(NO, (a.dv - c0) / W);
          V acc[RO][NO];
          for (auto& row : acc) {
            for (auto& x : row) x = S::zero();
          }
          const float* vc = vb + c0;
          int64_t j = 0;
          for (; j < shared; ++j, vc += a.v_t) {
            V vv[NO];
            for (int64_t n = 0; n < NO; ++n) vv[n] = n < nv ? S::load(vc + n * W) : S::zero();
            for (int64_t r = 0; r < RO; ++r) {
              const V pv = S::set1(prow[r][j]);
              for (int64_t n = 0; n < NO; ++n) acc[r][n] = S::fma(pv, vv[n], acc[r][n]);
            }
          }
          // The group's later rows' last keys: only the rows that see a key add it, so a
          // key hidden from a row (even one of value inf) never reaches that row.
          for (; j < shared + stored - 1; ++j, vc += a.v_t) {
            V vv[NO];
            for (int64_t n = 0; n < NO; ++n) vv[n] = n < nv ? S::load(vc + n * W) : S::zero();
            for (int64_t r = j - shared + 1; r < stored; ++r) {
              const V pv = S::set1(prow[r][j]);
              for (int64_t n = 0; n < NO; ++n) acc[r][n] = S::fma(pv, vv[n], acc[r][n]);
            }
          }
          for (int64_t r = 0; r < stored; ++r) {
            float* o = a.out + ((bh * a.Tq) + t0 + r0 + r) * a.dv + c0;
            const V scale = S::set1(inv[r0 + r]);
            for (int64_t n = 0; n < nv; ++n) S::store(o + n * W, S::mul(acc[r][n], scale));
          }
        }
      }
    }
  }
};

TORCHATTN_SIMD_KERNELS_END

}  // namespace

bool prefill_attention_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  if (best_isa() < Isa::Avx2) return false;
  if (!float_operand(q, 4) || !float_operand(k, 4) || !float_operand(v, 4)) return false;
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), d = q.size(3);
  if (B < 1 || H < 1 || Tq < 1 || d < 1 || k.size(0) != B || v.size(0) != B || k.size(1) < 1 || H % k.size(1) != 0 ||
      v.size(1) != k.size(1) || k.size(3) != d || k.size(2) < Tq || v.size(2) != k.size(2) || v.size(3) < 16 ||
      v.size(3) % 16 != 0) {
    return false;
  }
  return !needs_grad(q) && !needs_grad(k) && !needs_grad(v);
}

at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  return prefill_attention(q, k, v, scale, best_isa());
}

at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale, Isa isa) {
  TORCH_CHECK(float_operand(q, 4) && float_operand(k, 4) && float_operand(v, 4),
              "prefill_attention: expected float32 CPU q, k and v of 4 dimensions with unit last strides");
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), d = q.size(3);
  const int64_t Hkv = k.size(1), Tk = k.size(2), dv = v.size(3);
  TORCH_CHECK(Hkv >= 1 && H % Hkv == 0 && k.size(0) == B && v.size(0) == B && v.size(1) == Hkv && k.size(3) == d &&
                  v.size(2) == Tk && Tq >= 1 && Tk >= Tq && dv % 16 == 0 && dv > 0,
              "prefill_attention: expected q [B, H, Tq, d], k [B, Hkv, Tk, d], v [B, Hkv, Tk, dv] with H a multiple of "
              "Hkv, 1 <= Tq <= Tk and dv a multiple of 16, got q ",
              q.sizes(), ", k ", k.sizes(), ", v ", v.sizes());
  TORCH_CHECK(!needs_grad(q) && !needs_grad(k) && !needs_grad(v),
              "prefill_attention: computes no gradient; q, k and v must not need one");
  TORCH_CHECK(scale > 0.0 && std::isfinite(scale), "prefill_attention: expected a finite scale > 0, got ", scale);
  check_isa_at_most(isa, best_isa(), "prefill_attention");
  const int64_t TkP = (Tk + kKeyPad - 1) / kKeyPad * kKeyPad;
  at::Tensor kt = at::empty({B, Hkv, d, TkP}, q.options());
  kt.narrow(3, 0, Tk).copy_(k.transpose(2, 3));
  if (TkP > Tk) kt.narrow(3, Tk, TkP - Tk).zero_();
  at::Tensor out = at::empty({B, H, Tq, dv}, q.options());
  const Operands a{q.const_data_ptr<float>(),
                   q.stride(0),
                   q.stride(1),
                   q.stride(2),
                   kt.const_data_ptr<float>(),
                   v.const_data_ptr<float>(),
                   v.stride(0),
                   v.stride(1),
                   v.stride(2),
                   out.mutable_data_ptr<float>(),
                   H,
                   H / Hkv,
                   Tq,
                   Tk,
                   TkP,
                   d,
                   dv,
                   Tk - Tq,
                   static_cast<float>(scale)};
  const int64_t rows = simd::run_on<BlockRows>(isa), blocks = (Tq + rows - 1) / rows, tasks = B * H * blocks;
  // Multiply-adds of an average block: its rows over about half the keys and more.
  const int64_t per_task = rows * (Tk - Tq / 2) * (d + dv);
  parallel_for_work(tasks, per_task,
                    [&](int64_t begin, int64_t end) { simd::run_on<CausalBlocks>(isa, a, begin, end); });
  return out;
}

}  // namespace torchattn::kernels::cpu

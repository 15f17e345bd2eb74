#pragma once

// One task of the paged attention kernel (paged_attention.cpp cuts a step into them),
// written once over the vector types of simd.h. A task is a sequence's key head and a
// block of its new rows, times the G query heads that share that key head (R rows):
//   1. scores: for each block of keys, W keys at a time (the block's keys are
//      transposed, [d, block_size], so a lane is a key): acc += q[c] * k[c][lanes] over
//      c in order, for a tile of 4 rows times KT key vectors; times the scale; then
//      softcap * tanh(s / softcap) and + slope * (key - position) where asked; -inf
//      where the row does not see the key (past its position, before its window);
//   2. softmax numerators: p = exp(s - max) (0 where s is -inf), and their sum, W lanes
//      at a time from key 0 (row_softmax.h); with a sink, the max takes it in and the
//      sum its exp;
//   3. out = sum_j p_j v_j / sum over j in order, for a tile of 4 rows times CT vectors
//      of W output features.
// A row's operations and their order depend only on its own query, position and
// keys, never on the rows beside it, the number of rows or the tiles (a task that
// stops at fewer keys drops only terms that are exactly zero).

#include <torchattn/detail/kernels/cpu/row_softmax.h>
#include <torchattn/detail/kernels/cpu/simd.h>

#include <cstdint>

namespace torchattn::kernels::cpu::paged {

/// What one task reads and writes.
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

/// The tile of a vector type: key vectors (KT) and output-feature vectors (CT) per 4
/// rows, as many accumulators as its registers hold.
template <Isa>
struct Tile;
template <>
struct Tile<Isa::Scalar> {
  static constexpr int KT = 4, CT = 4;
};
template <>
struct Tile<Isa::Avx2> {
  static constexpr int KT = 2, CT = 2;  // 16 registers: 4 rows x 2 accumulators, loads
};
template <>
struct Tile<Isa::Avx512> {
  static constexpr int KT = 3, CT = 4;  // 32 registers
};

TORCHATTN_SIMD_KERNELS_BEGIN

/// The kernel for simd::run_on: Rows::run<S>(task, scratch), scratch holding
/// rows * groups * (keys + 1) floats.
struct Rows {
  static constexpr Isa kWidest = Isa::Avx512;

  template <class S>
  static void run(const Task& t, float* scratch) {
    using V = typename S::V;
    constexpr int W = S::W;
    constexpr int RT = 4;  // rows computed together, sharing each loaded key or value
    const int64_t R = t.rows * t.groups, L = t.keys, d = t.dim, bs = t.block_size;
    float* scores = scratch;  // [R, L]: scores, then probabilities
    auto row_q = [&](int64_t r) { return t.q + (r / t.groups) * t.q_row + (r % t.groups) * t.q_head; };
    auto first_key = [&](int64_t r) {
      const int64_t position = L - t.rows + r / t.groups;
      return t.window > 0 ? (position - t.window + 1 > 0 ? position - t.window + 1 : int64_t{0}) : int64_t{0};
    };
    auto last_key = [&](int64_t r) { return L - t.rows + r / t.groups; };
    const V scale = S::set1(t.scale);

    // Pass 1: scores of every (row, key) in [0, L); keys a row does not see are -inf.
    // A tile is RT rows times KT vectors of W keys (each vector within one block): each
    // loaded key feeds RT rows and each broadcast query feature KT vectors.
    constexpr int KT = Tile<S::kIsa>::KT;
    struct KeyVector {
      const float* k;  // the vector's first key, feature 0 ([d, bs] block, a key per column)
      int64_t j0;      // its first key's index
      int lanes;
    };
    KeyVector kv[KT];
    for (int64_t b = 0, t0 = 0; b * bs < L;) {
      int nk = 0;
      while (nk < KT && b * bs < L) {
        const int64_t cnt = L - b * bs < bs ? L - b * bs : bs;
        kv[nk++] = KeyVector{t.key_blocks[b] + t0, b * bs + t0, static_cast<int>(cnt - t0 < W ? cnt - t0 : W)};
        t0 += W;
        if (t0 >= cnt) {
          ++b;
          t0 = 0;
        }
      }
      for (int kk = nk; kk < KT; ++kk) kv[kk] = kv[0];  // padding: computed, not stored
      for (int64_t r0 = 0; r0 < R; r0 += RT) {
        const int64_t rt = R - r0 < RT ? R - r0 : RT;
        V acc[RT][KT];
        const float* qs[RT];
        for (int i = 0; i < RT; ++i) {
          for (int kk = 0; kk < KT; ++kk) acc[i][kk] = S::zero();
          qs[i] = row_q(r0 + (i < rt ? i : 0));
        }
        for (int64_t c = 0; c < d; ++c) {
          V k[KT];
          for (int kk = 0; kk < KT; ++kk) k[kk] = S::load(kv[kk].k + c * bs, kv[kk].lanes);
          for (int i = 0; i < RT; ++i) {
            const V qc = S::set1(qs[i][c]);
            for (int kk = 0; kk < KT; ++kk) acc[i][kk] = S::fma(qc, k[kk], acc[i][kk]);
          }
        }
        for (int64_t i = 0; i < rt; ++i) {
          const int64_t r = r0 + i;
          for (int kk = 0; kk < nk; ++kk) {
            V s = S::mul(acc[i][kk], scale);
            if (t.softcap > 0.0f) s = S::mul(S::tanh(S::div(s, S::set1(t.softcap))), S::set1(t.softcap));
            if (t.slopes != nullptr) {
              s = S::add(s, S::mul(S::set1(t.slopes[r % t.groups]), S::iota(kv[kk].j0 - last_key(r))));
            }
            s = S::keep_between(s, kv[kk].j0, first_key(r), last_key(r), simd::kNegInf);
            S::store(scores + r * L + kv[kk].j0, s, kv[kk].lanes);
          }
        }
      }
    }

    // Pass 2: each row's softmax numerators in place, and their sum (RowSoftmax, the
    // whole row one block); a sink joins the max and the sum.
    float* inverses = scores + R * L;
    for (int64_t r = 0; r < R; ++r) {
      RowSoftmax<S> row;
      if (t.sinks != nullptr) row.add_sink(t.sinks[r % t.groups]);
      row.add(scores + r * L, L);
      inverses[r] = row.inverse();
    }

    // Pass 3: out = sum_j p_j v_j / total. A tile is RT rows times CT vectors of W
    // output features: each loaded value vector feeds RT rows, each broadcast p_j CT
    // vectors.
    constexpr int CT = Tile<S::kIsa>::CT;
    for (int64_t r0 = 0; r0 < R; r0 += RT) {
      const int64_t rt = R - r0 < RT ? R - r0 : RT;
      int64_t lo = L, hi = -1;
      for (int64_t i = 0; i < rt; ++i) {
        lo = first_key(r0 + i) < lo ? first_key(r0 + i) : lo;
        hi = last_key(r0 + i) > hi ? last_key(r0 + i) : hi;
      }
      const float* ps[RT];
      for (int i = 0; i < RT; ++i) ps[i] = scores + (r0 + (i < rt ? i : 0)) * L;
      for (int64_t c0 = 0; c0 < d; c0 += int64_t{CT} * W) {
        int64_t col[CT];
        int lanes[CT];
        for (int cc = 0; cc < CT; ++cc) {
          const int64_t c = c0 + int64_t{cc} * W < d ? c0 + int64_t{cc} * W : c0;  // padding: computed, not stored
          col[cc] = c;
          lanes[cc] = static_cast<int>(d - c < W ? d - c : W);
        }
        V o[RT][CT];
        for (auto& row : o) {
          for (V& lane : row) lane = S::zero();
        }
        for (int64_t j = lo; j <= hi; ++j) {
          const float* vj = t.value_blocks[j / bs] + (j % bs) * d;
          V v[CT];
          for (int cc = 0; cc < CT; ++cc) v[cc] = S::load(vj + col[cc], lanes[cc]);
          for (int i = 0; i < RT; ++i) {
            const V p = S::set1(ps[i][j]);
            for (int cc = 0; cc < CT; ++cc) o[i][cc] = S::fma(p, v[cc], o[i][cc]);
          }
        }
        for (int64_t i = 0; i < rt; ++i) {
          const int64_t r = r0 + i;
          float* out = t.out + (r / t.groups) * t.out_row + (r % t.groups) * t.out_head;
          const V inv = S::set1(inverses[r]);
          for (int cc = 0; cc < CT && c0 + int64_t{cc} * W < d; ++cc)
            S::store(out + col[cc], S::mul(o[i][cc], inv), lanes[cc]);
        }
      }
    }
  }
};

TORCHATTN_SIMD_KERNELS_END

}  // namespace torchattn::kernels::cpu::paged

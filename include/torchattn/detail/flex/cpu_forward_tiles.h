#pragma once

// flex_attention's float32 forward on the CPU (flex_attention.h), written once over the
// vector types of the SIMD layer (detail/kernels/cpu/simd.h) and entered through run_on at the
// widest instruction set this CPU runs (AVX-512, AVX2 or plain floats), all inside the
// caller's translation unit: score_mod and mask_mod are inlined into the kernel of each
// instruction set, which the library's own kernels cannot do for a callable they never
// saw.
//
// A task is a tile of R query rows (AVX-512: 8, else 4) of one batch and head, within
// one block of queries of the block mask. For each block of keys the mask keeps (the
// full ones, then the partial ones), in order:
//   1. the scores of the tile, R rows x the block's keys, scaled (registers: R rows x
//      2 vectors of keys, over keys packed transposed);
//   2. score_mod per kept score (skipped for IdentityScore; W keys at a time for a mod
//      that runs on Lanes, lanes.h), mask_mod per key of a partial block (-inf where it
//      hides; a RangedMask's runs instead, mods.h, and the block cut after the last key
//      the tile's rows see);
//   3. the online softmax of each row (RowSoftmax): numerators, and the factor for
//      what the row had accumulated;
//   4. the row's accumulated values, rescaled, plus numerators x values (registers:
//      RO rows x 4 vectors of value columns).
// Empty blocks are never read. The tasks of a head run in zigzag order (first, last,
// second, ...), so that a causal mask's split of them gives each thread as many keys.
//
// A call of fewer query rows than a tile (decoding) makes no transposed copy of all the
// keys: each block of keys is transposed where it is read, the next block's keys and
// values prefetched meanwhile (a step streams the cache from memory, alternating them:
// 32768 keys of 8 heads, 1 thread, 1.13x the decode kernel's time without, 0.84x with). With grouped heads under a
// mask every head shares, the G query heads of a key/value head fill one tile's rows
// ("fold"), so each block of keys and values is read once for all of them. A decoding
// call of few tasks over many keys splits each task's blocks into parts (split_keys),
// run as tasks of their own, whose sums combine_splits joins, as flash-decoding does:
// a call of 3 key/value heads then keeps 2 threads busy.

#include <torchattn/flex/block_mask.h>
#include <torchattn/detail/flex/cpu_tiles.h>
#include <torchattn/flex/inputs.h>
#include <torchattn/flex/lanes.h>
#include <torchattn/detail/kernels/cpu/cpu_features.h>
#include <torchattn/detail/kernels/cpu/row_softmax.h>
#include <torchattn/detail/kernels/cpu/simd.h>

#include <torchattn/detail/kernels/cpu/parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

TORCHATTN_SIMD_KERNELS_BEGIN

namespace torchattn::flex {

/// One float32 call's operands: q and v rows (unit last stride), the keys packed
/// transposed, [B, Hkv, D, Tk_pad] with zeros past Tk, or (kt null: a call of fewer rows
/// than a tile, which reads each block of keys once a head or group) the keys' rows
/// (unit last stride), each block packed where it is read; and the outputs.
struct TileOperands {
  const float* q;
  int64_t q_b, q_h, q_t;
  const float* kt;
  int64_t tk_pad;
  const float* k;
  int64_t k_b, k_h, k_t;
  const float* v;
  int64_t v_b, v_h, v_t;
  float* out;  // [B, H, Tq, Dv], contiguous
  float* lse;  // [B, H, Tq]
  /// Splits of each task's blocks of keys (split_keys): part p of `splits` writes its
  /// rows' unnormalized sums, max and sum of numerators here, combine_splits the output.
  int64_t splits = 1;
  float* part_acc = nullptr;  // [splits, B * H * Tq, Dv]
  float* part_max = nullptr;  // [splits, B * H * Tq]
  float* part_sum = nullptr;  // [splits, B * H * Tq]
};

/// Parts of the keys each task of a decoding call (fewer rows than a tile) is split
/// into, so that a call of few heads keeps every thread busy over a long cache, as
/// flash-decoding splits the keys: a part of at least kSplitBlocks blocks, only where
/// the call has fewer than kSplitTasks tasks. A function of the shapes alone, never of
/// the thread count: the sums (and so the rounding) are the same on any number of
/// threads.
inline int64_t split_keys(bool few_rows, int64_t tasks, int64_t kv_blocks) {
  constexpr int64_t kSplitTasks = 64, kSplitBlocks = 4, kMostSplits = 16;
  if (!few_rows || tasks >= kSplitTasks) return 1;
  return std::clamp<int64_t>(kv_blocks / kSplitBlocks, 1, kMostSplits);
}

/// The rows of a split call (split_keys): out [rows, Dv] and lse [rows] from the parts'
/// unnormalized sums (acc [splits, rows, Dv]), max and sum of numerators, as one pass
/// over every key gives them within float32 rounding. A part that saw no key is left
/// out; a NaN sum (a NaN or +inf score) makes the row NaN.
inline void combine_splits(const float* acc, const float* max, const float* sum, int64_t splits, int64_t rows,
                           int64_t Dv, float* out, float* lse) {
  for (int64_t row = 0; row < rows; ++row) {
    float top = -std::numeric_limits<float>::infinity(), total = 0.0f;
    bool nan = false;
    for (int64_t p = 0; p < splits; ++p) {
      const float l = sum[p * rows + row];
      nan = nan || std::isnan(l);
      if (l > 0.0f) top = std::max(top, max[p * rows + row]);
    }
    float* o = out + row * Dv;
    std::fill(o, o + Dv, 0.0f);
    for (int64_t p = 0; p < splits && !nan; ++p) {
      const float l = sum[p * rows + row];
      if (!(l > 0.0f)) continue;
      const float f = std::exp(max[p * rows + row] - top);
      total += l * f;
      const float* a = acc + (p * rows + row) * Dv;
      for (int64_t e = 0; e < Dv; ++e) o[e] += f * a[e];
    }
    if (nan) {
      std::fill(o, o + Dv, std::numeric_limits<float>::quiet_NaN());
      lse[row] = std::numeric_limits<float>::quiet_NaN();
    } else if (total == 0.0f) {  // no key seen: zeros, lse -inf
      lse[row] = -std::numeric_limits<float>::infinity();
    } else {
      const float inverse = 1.0f / total;
      for (int64_t e = 0; e < Dv; ++e) o[e] *= inverse;
      lse[row] = top + std::log(total);
    }
  }
}

template <class ScoreMod, class MaskMod>
struct ForwardTiles {
  static constexpr kernels::cpu::Isa kWidest = kernels::cpu::Isa::Avx512;

  /// Query rows of a tile for the vector type S (a block of queries holds whole tiles
  /// but for its last).
  template <class S>
  static constexpr int64_t rows() {
    return S::W == 16 ? 8 : 4;
  }


  /// Tiles of R rows in a block of queries: its G x (block size, or the queries if
  /// fewer) rows.
  static int64_t tiles_per_block(int64_t R, int64_t G, int64_t block_size, int64_t q_len) {
    return (G * std::min(block_size, q_len) + R - 1) / R;
  }

  /// Query rows of a tile for `isa`'s vector type (the task count's).
  struct TileRows {
    static constexpr kernels::cpu::Isa kWidest = kernels::cpu::Isa::Avx512;
    template <class S>
    static int64_t run() {
      return rows<S>();
    }
  };

  /// score_mod on W scores (kScoresInLanes), inlined where it is called (simd.h's
  /// TORCHATTN_SIMD_FLATTEN).
  template <class S>
  TORCHATTN_SIMD_FLATTEN static Lanes<S> mod_lanes(const ScoreMod& score_mod, const Lanes<S>& in, int64_t b, int64_t h,
                                                   int64_t i, int64_t j) {
    return score_mod(in, b, h, i, LaneIndex<S>{j});
  }

  /// Tasks [begin, end) of B * H * q_blocks * tiles_per_block, or with `fold` (grouped
  /// heads, a mask the same for every head) B * Hkv * q_blocks * tiles of the G * block
  /// rows (see the file's comment).
  template <class S>
  static void run(const TileOperands& a, const Shapes& s, const ScoreMod& score_mod, const BlockMask<MaskMod>& mask,
                  bool fold, int64_t begin, int64_t end) {
    using V = typename S::V;
    using Softmax = kernels::cpu::RowSoftmax<S>;
    constexpr int W = S::W;
    constexpr int64_t R = rows<S>(), KT = kScoreTileVectors * W, RO = W == 16 ? 4 : 2, NO = 4;
    constexpr bool kModsScores = !std::is_same_v<ScoreMod, IdentityScore>;
    constexpr bool kRanged = RangedMask<MaskMod>;
    const int64_t group = s.H / s.Hkv, G = fold ? group : 1, Dv = s.Dv;
    const int64_t bs = mask.shape.block_size, nq = mask.shape.q_blocks(), tiles = tiles_per_block(R, G, bs, s.Tq);
    const int64_t per_head = nq * tiles, heads = fold ? s.Hkv : s.H;
    // A row of scores, and (a call that packs no keys) a row of one block of keys transposed.
    const int64_t stride = (bs + KT - 1) / KT * KT;
    std::vector<float> scores(static_cast<size_t>(R * stride));
    std::vector<float> acc(static_cast<size_t>(R * Dv));
    // Without a packed copy of the keys: one block of them, transposed.
    std::vector<float> block_keys(a.kt == nullptr ? static_cast<size_t>(s.D * stride) : 0);
    const V vscale = S::set1(static_cast<float>(s.scale));
    const int64_t splits = a.splits;
    for (int64_t split_task = begin; split_task < end; ++split_task) {
      const int64_t task = split_task / splits, part = split_task % splits;
      const int64_t bh = task / per_head, p = task % per_head;
      const int64_t zig = p % 2 == 0 ? p / 2 : per_head - 1 - p / 2;
      // Row p of the block's G * bs is query qb * bs + p / G of head h0 + p % G.
      const int64_t qb = zig / tiles, p0 = zig % tiles * R;
      const int64_t rows = std::min(R, G * (std::min(s.Tq, (qb + 1) * bs) - qb * bs) - p0);
      if (rows <= 0) continue;  // past the last block's queries
      const int64_t b = bh / heads, hk = fold ? bh % heads : bh % heads / group, h0 = fold ? hk * group : bh % heads;
      const float* kt = a.kt == nullptr ? nullptr : a.kt + (b * s.Hkv + hk) * s.D * a.tk_pad;
      const float* vh = a.v + b * a.v_b + hk * a.v_h;
      // Each row's head and query; rows past the tile's last compute a copy of it, never stored.
      int64_t hrow[R], irow[R];
      const float* qrow[R];
      for (int64_t r = 0; r < R; ++r) {
        const int64_t p = p0 + std::min(r, rows - 1);
        hrow[r] = h0 + p % G, irow[r] = qb * bs + p / G;
        qrow[r] = a.q + b * a.q_b + hrow[r] * a.q_h + irow[r] * a.q_t;
      }
      Softmax softmax[R];
      float rescale[R];
      std::fill(acc.begin(), acc.end(), 0.0f);
      const auto blocks = mask.key_blocks(b, h0, qb);  // folded: the same for every head
      // This part's share of the blocks, the full ones counted first.
      const int64_t kept = int64_t{blocks.count[0]} + blocks.count[1];
      const int64_t share_begin = kept * part / splits, share_end = kept * (part + 1) / splits;
      for (int kind = 0; kind < 2; ++kind) {  // 0: full blocks, 1: partial ones
        const int64_t before = kind == 0 ? 0 : blocks.count[0];
        const auto c_end = static_cast<int32_t>(std::clamp<int64_t>(share_end - before, 0, blocks.count[kind]));
        for (auto c = static_cast<int32_t>(std::clamp<int64_t>(share_begin - before, 0, blocks.count[kind])); c < c_end;
             ++c) {
          const int64_t j0 = static_cast<int64_t>(blocks.index[kind][c]) * bs;
          int64_t n = std::min(bs, s.Tk - j0);
          // A partial block under a mask of runs: each row's run within the block, and
          // the block cut after the last key a row sees.
          [[maybe_unused]] int64_t run_begin[R], run_end[R];
          if constexpr (kRanged) {
            if (kind == 1) {
              int64_t last = 0;
              for (int64_t r = 0; r < rows; ++r) {
                KeyRange run = mask.mask_mod.keys(irow[r]) & KeyRange{j0, j0 + n};
                if (run.begin >= run.end) run = {j0, j0};  // none of this block's keys
                run_begin[r] = run.begin - j0, run_end[r] = run.end - j0;
                last = std::max(last, run_end[r]);
              }
              n = last;
              if (n == 0) continue;  // no row of this tile sees a key of it
            }
          }
          // 1. Scaled scores, whole tiles of keys (past n: read from the pad).
          if (a.kt != nullptr) {
            score_rows<S, R>(rows, qrow, kt + j0, a.tk_pad, s.D, n, scores.data(), stride, vscale);
          } else {
            // The next block's keys and values on their way in while this one is computed:
            // a decoding step streams the cache from memory, alternating the two.
            if (c + 1 < c_end) {
              const int64_t next = static_cast<int64_t>(blocks.index[kind][c + 1]) * bs;
              prefetch_rows(a.k + b * a.k_b + hk * a.k_h + next * a.k_t, a.k_t, std::min(bs, s.Tk - next), s.D);
              prefetch_rows(vh + next * a.v_t, a.v_t, std::min(bs, s.Tk - next), Dv);
            }
            // Columns past n keep zeros or an earlier block's keys: scores never read.
            transpose_keys<S>(a.k + b * a.k_b + hk * a.k_h + j0 * a.k_t, a.k_t, n, s.D, block_keys.data(), stride);
            score_rows<S, R>(rows, qrow, block_keys.data(), stride, s.D, n, scores.data(), stride, vscale);
          }
          // 2. The mods, per score.
          if (kind == 1 || kModsScores) {
            for (int64_t r = 0; r < rows; ++r) {
              float* sr = scores.data() + r * stride;
              const int64_t h = hrow[r], i = irow[r];
              if constexpr (kModsScores && runs_in_lanes<ScoreMod>) {  // W keys at a time (lanes.h)
                for (int64_t j = 0; j < n; j += W) {                   // lanes past n: the pad's, never read
                  Lanes<S> in;
                  S::store(in.x, S::load(sr + j));
                  const Lanes<S> out = mod_lanes<S>(score_mod, in, b, h, i, j0 + j);
                  S::store(sr + j, S::load(out.x));
                }
              } else if constexpr (kRanged) {
                const int64_t from = kind == 1 ? run_begin[r] : 0, to = kind == 1 ? run_end[r] : n;
                if constexpr (kModsScores) {
                  for (int64_t j = from; j < to; ++j) sr[j] = static_cast<float>(score_mod(sr[j], b, h, i, j0 + j));
                }
              }
              if constexpr (kRanged || (kModsScores && runs_in_lanes<ScoreMod>)) {
                if (kind == 1) {
                  if constexpr (kRanged) {  // the run's keys kept, the others hidden
                    std::fill(sr, sr + run_begin[r], kernels::cpu::simd::kNegInf);
                    std::fill(sr + run_end[r], sr + n, kernels::cpu::simd::kNegInf);
                  } else {
                    for (int64_t j = 0; j < n; ++j) {
                      if (!mask.visible(b, h, i, j0 + j)) sr[j] = kernels::cpu::simd::kNegInf;
                    }
                  }
                }
                continue;
              }
              for (int64_t j = 0; j < n; ++j) {
                if (kind == 1 && !mask.visible(b, h, i, j0 + j)) {
                  sr[j] = kernels::cpu::simd::kNegInf;
                } else if constexpr (kModsScores) {
                  sr[j] = static_cast<float>(score_mod(sr[j], b, h, i, j0 + j));
                }
              }
            }
          }
          // 3. Numerators, and each row's factor for what it holds.
          for (int64_t r = 0; r < rows; ++r) rescale[r] = softmax[r].add(scores.data() + r * stride, n);
          // 4. acc = acc * rescale + numerators x values, RO rows x NO vectors at a time.
          if constexpr (kRanged) {
            if (kind == 1) {
              // The keys every row of the tile sees by the tile; each row's others one
              // by one, and only those it sees: a key a run leaves out never reaches
              // the row, not even a value of inf (0 x inf).
              int64_t lo = 0, hi = n;
              for (int64_t r = 0; r < rows; ++r) lo = std::max(lo, run_begin[r]), hi = std::min(hi, run_end[r]);
              hi = std::max(hi, lo);
              weigh_rows<S, RO, NO>(scores.data() + lo, stride, acc.data(), Dv, rescale, rows, vh + (j0 + lo) * a.v_t,
                                    a.v_t, hi - lo, Dv);
              for (int64_t r = 0; r < rows; ++r) {
                const float* sr = scores.data() + r * stride;
                float* ar = acc.data() + r * Dv;
                const auto add = [&](int64_t from, int64_t to) {  // the row's keys [from, to), as they are
                  if (from < to) {
                    weigh_rows<S, 1, NO>(sr + from, stride, ar, Dv, nullptr, 1, vh + (j0 + from) * a.v_t, a.v_t,
                                         to - from, Dv);
                  }
                };
                add(run_begin[r], std::min(lo, run_end[r]));
                add(std::max(hi, run_begin[r]), run_end[r]);
              }
              continue;
            }
          }
          weigh_rows<S, RO, NO>(scores.data(), stride, acc.data(), Dv, rescale, rows, vh + j0 * a.v_t, a.v_t, n, Dv);
        }
      }
      // The rows' outputs: acc / sum; the log-sum-exp max + log(sum) (-inf for a row
      // that saw no key, whose acc stayed zeros; NaN after a NaN or +inf score).
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t row = (b * s.H + hrow[r]) * s.Tq + irow[r];
        if (splits > 1) {  // this part's sums, for combine_splits
          const int64_t at = part * s.B * s.H * s.Tq + row;
          std::copy_n(acc.data() + r * Dv, Dv, a.part_acc + at * Dv);
          a.part_max[at] = softmax[r].max;
          a.part_sum[at] = softmax[r].sum;
          continue;
        }
        const float inverse = softmax[r].inverse();
        float* o = a.out + row * Dv;
        const float* ar = acc.data() + r * Dv;
        for (int64_t e = 0; e < Dv; ++e) o[e] = ar[e] * inverse;
        const float sum = softmax[r].sum;
        a.lse[row] = std::isnan(sum) ? sum
                     : sum == 0.0f   ? -std::numeric_limits<float>::infinity()
                                     : softmax[r].max + std::log(sum);
      }
    }
  }
};

/// out [B, H, Tq, Dv] and lse [B, H, Tq] of a float32 call (checked inputs, sizes s).
template <class ScoreMod, class MaskMod>
void forward_tiles(const at::Tensor& q_in, const at::Tensor& k, const at::Tensor& v_in, const Shapes& s,
                   const ScoreMod& score_mod, const BlockMask<MaskMod>& mask, at::Tensor& out, at::Tensor& lse) {
  using Kernel = ForwardTiles<ScoreMod, MaskMod>;
  const at::Tensor q = q_in.stride(3) == 1 ? q_in : q_in.contiguous();
  const at::Tensor v = v_in.stride(3) == 1 ? v_in : v_in.contiguous();
  const kernels::cpu::Isa isa = kernels::cpu::best_isa();
  const int64_t R = kernels::cpu::simd::run_on<typename Kernel::TileRows>(isa);
  // Fewer rows than a tile (decoding): each block of keys is read once a head (a group,
  // folded), so it is packed where it is read rather than all of them first, a copy as
  // large as the cache (48 ms of a 61 ms call over 32768 keys, 8 heads of 64, 2 threads).
  const bool few_rows = s.Tq < R;
  const at::Tensor kr = few_rows && k.stride(3) != 1 ? k.contiguous() : k;
  const at::Tensor kt = few_rows ? at::Tensor() : pack_transposed(k);
  TileOperands a{q.const_data_ptr<float>(),
                 q.stride(0),
                 q.stride(1),
                 q.stride(2),
                 few_rows ? nullptr : kt.const_data_ptr<float>(),
                 few_rows ? 0 : kt.size(3),
                 kr.const_data_ptr<float>(),
                 kr.stride(0),
                 kr.stride(1),
                 kr.stride(2),
                 v.const_data_ptr<float>(),
                 v.stride(0),
                 v.stride(1),
                 v.stride(2),
                 out.mutable_data_ptr<float>(),
                 lse.mutable_data_ptr<float>()};
  // Grouped heads under a mask the same for every head, with fewer rows than a tile per
  // head (decoding): the G heads of a key/value head share tiles, so that each block of
  // keys and values is read once for all of them.
  const int64_t group = s.H / s.Hkv;
  const bool fold = group > 1 && mask.shape.heads == 1 && few_rows;
  const int64_t G = fold ? group : 1;
  const int64_t tasks = s.B * (fold ? s.Hkv : s.H) * mask.shape.q_blocks() *
                        Kernel::tiles_per_block(R, G, mask.shape.block_size, s.Tq);
  a.splits = split_keys(few_rows, tasks, mask.shape.kv_blocks());
  at::Tensor parts;
  const int64_t out_rows = s.B * s.H * s.Tq;
  if (a.splits > 1) {
    parts = at::empty({a.splits * out_rows * (s.Dv + 2)}, q.options());
    a.part_acc = parts.mutable_data_ptr<float>();
    a.part_max = a.part_acc + a.splits * out_rows * s.Dv;
    a.part_sum = a.part_max + a.splits * out_rows;
  }
  // On the calling thread where the work is too small to pay for a parallel region (an
  // empty batch has no task, and no work per task to divide).
  const int64_t items = tasks * a.splits;
  if (items == 0) return;
  const double work = static_cast<double>(out_rows) * static_cast<double>(s.Tk) * static_cast<double>(s.D + s.Dv);
  kernels::cpu::parallel_for_work(items, static_cast<int64_t>(work / static_cast<double>(items)),
                                  [&](int64_t begin, int64_t end) {
                                    kernels::cpu::simd::run_on<Kernel>(isa, a, s, score_mod, mask, fold, begin, end);
                                  });
  if (a.splits > 1) {
    combine_splits(a.part_acc, a.part_max, a.part_sum, a.splits, out_rows, s.Dv, a.out, a.lse);
  }
}

}  // namespace torchattn::flex

TORCHATTN_SIMD_KERNELS_END

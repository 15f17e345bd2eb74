#include "kernels/cpu/paged_attention.h"

#include "kernels/cpu/float_operand.h"
#include "kernels/cpu/needs_grad.h"
#include "kernels/cpu/paged_attention_rows.h"
#include "kernels/cpu/stall_aware.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

// The steps of the algorithm and the task's arithmetic: paged_attention_rows.h. Here:
// the checks, and the step cut into tasks of equal work for the threads.

namespace torchattn::kernels::cpu {

namespace {

// Multiply-adds below which the step runs on the calling thread (see
// decode_attention: a parallel region costs more than small work).
constexpr int64_t kPagedSerialWork = 1 << 18;

// New rows of one sequence per task (times the query heads of a key head).
constexpr int64_t kRowBlock = 8;

// A float32 operand no gradient flows through.
bool plain_float(const at::Tensor& t, int64_t dim) { return float_operand(t, dim) && !needs_grad(t); }

}  // namespace

std::vector<PagedIsa> paged_isas() { return supported_isas(); }

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
  if (isa) check_isa_at_most(*isa, best_isa(), "paged_attention");
  const Isa run_isa = isa.value_or(best_isa());

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
      const paged::Task t{qp + row * q.stride(0) + p.hk * G * q.stride(1),
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
      simd::run_on<paged::Rows>(run_isa, t, scratch.data());
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
  const int64_t n_parts = std::min<int64_t>(n_pieces, int64_t{4} * std::max(1, at::get_num_threads()));
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

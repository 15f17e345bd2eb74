// What flex_attention and create_block_mask (include/torchattn/flex_attention.h) refuse
// or define where a C++ user's ordinary habits would give wrong numbers: block sizes past
// the lengths (one block, never an overflow), masks too large to hold (an error naming
// the sizes), a broadcast (B or H of 1) mask asked with b = h = 0 everywhere whatever the
// block size, hand-made masks listing a key block twice, the ready-made variants' tables
// against the heads and lengths, the log-sum-exp's gradient (against ATen's autograd
// through the same math) and a double backward (an error naming flex_attention). The
// compile-time refusals (a cast of the score, a wrong signature) are
// tests/backends/flex_signatures.cpp's.

#include "common/expect_error.h"

#include <torchattn/flex/variants.h>
#include <torchattn/flex_attention.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace flex_signatures {
at::Tensor run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);  // flex_signatures.cpp
}

namespace flex_refusals_test {

namespace flex = torchattn::flex;

struct CausalMask {
  bool operator()(int64_t, int64_t, int64_t q, int64_t kv) const { return kv <= q; }
};

// softmax(score_mod(q k^T scale) masked) v and the log-sum-exp, on whole score matrices
// with ATen's ops (autograd's reference): `visible` [Tq, Tk] bool or [B, H, Tq, Tk].
std::pair<torch::Tensor, torch::Tensor> dense(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                              const torch::Tensor& visible) {
  const int64_t group = q.size(1) / k.size(1);
  const auto kk = k.repeat_interleave(group, 1), vv = v.repeat_interleave(group, 1);
  auto s = torch::matmul(q, kk.transpose(-1, -2)) / std::sqrt(static_cast<double>(q.size(-1)));
  s = s.masked_fill(visible.logical_not(), -std::numeric_limits<double>::infinity());
  return {torch::matmul(torch::softmax(s, -1), vv), torch::logsumexp(s, -1)};
}

// The [B, H, Tq, Tk] mask of `mask_mod` asked at every (b, h, q, kv).
template <class MaskMod>
torch::Tensor dense_mask(const MaskMod& mask_mod, int64_t B, int64_t H, int64_t Tq, int64_t Tk) {
  auto m = torch::zeros({B, H, Tq, Tk}, torch::kBool);
  auto a = m.accessor<bool, 4>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Tq; ++i)
        for (int64_t j = 0; j < Tk; ++j) a[b][h][i][j] = mask_mod(b, h, i, j);
  return m;
}

// A block size past both lengths is one block each way, the same mask (PyTorch's counts)
// and the same attention as any such size; 2^62 and int64's largest included.
TEST(FlexRefusals, BlockSizesPastTheLengthsAreOneBlock) {
  torch::manual_seed(5);
  const auto q = torch::randn({1, 2, 10, 8}), k = torch::randn({1, 2, 12, 8}), v = torch::randn({1, 2, 12, 8});
  const auto want = torchattn::create_block_mask(CausalMask{}, 1, 1, 10, 12, 128);
  EXPECT_EQ(want.shape.block_size, 13);
  const auto out = torchattn::flex_attention(q, k, v, want).output;
  for (const int64_t bs : {int64_t{13}, int64_t{1} << 40, int64_t{1} << 62, std::numeric_limits<int64_t>::max()}) {
    SCOPED_TRACE(bs);
    const auto m = torchattn::create_block_mask(CausalMask{}, 1, 1, 10, 12, bs);
    EXPECT_EQ(m.shape.q_blocks(), 1);
    EXPECT_EQ(m.shape.kv_blocks(), 1);
    EXPECT_TRUE(torch::equal(m.kv_num_blocks, want.kv_num_blocks));
    EXPECT_TRUE(torch::equal(m.full_kv_num_blocks, want.full_kv_num_blocks));
    EXPECT_TRUE(torch::equal(torchattn::flex_attention(q, k, v, m).output, out));
  }
  EXPECT_EQ((torchattn::BlockMaskShape{1, 1, 10, 12, std::numeric_limits<int64_t>::max()}.q_blocks()), 1);
  // A hand-made mask that records such a size is told the one to give.
  auto hand = want;
  hand.shape.block_size = int64_t{1} << 40;
  expect_error([&] { torchattn::flex_attention(q, k, v, hand); },
               "flex_attention: block_mask's block_size 1099511627776 is past both lengths (q_len 10, kv_len 12): "
               "give 13");
}

// Index tables that could never be held, or past int32: an error naming the sizes,
// before any allocation.
TEST(FlexRefusals, MasksTooLargeToHoldNameTheirSizes) {
  const int64_t big = int64_t{1} << 20;
  const std::string msg = error_of(
      [&] { torchattn::create_block_mask(torchattn::VisibleKeys{}, big, big, big, big, 1); });
  EXPECT_HAS(msg, "create_block_mask: B 1048576 x H 1048576 x 1048576 query blocks x 1048576 key blocks need");
  EXPECT_HAS(msg, "GB of block indices, more than this machine's");
  EXPECT_EQ(msg.find("alloc"), std::string::npos) << msg;
  const std::string real = error_of([&] { torchattn::create_block_mask(CausalMask{}, 64, 64, 65536, 65536, 16); });
  EXPECT_HAS(real, "create_block_mask: B 64 x H 64 x 4096 query blocks x 4096 key blocks need 549.7");
  EXPECT_HAS(real, "make it for B or H of 1");
  expect_error([&] { torchattn::create_block_mask(torchattn::VisibleKeys{}, 1, 1, 1, int64_t{1} << 40, 1); },
               "create_block_mask: kv_len 1099511627776 in blocks of 1 makes 1099511627776 key blocks, past what the "
               "int32 indices hold");
}

// A mask made for H = 1 (B = 1) asks mask_mod with h = 0 (b = 0) everywhere: in its
// empty and full blocks as in its partial ones, so every block size gives one answer.
TEST(FlexRefusals, BroadcastMasksAskMaskModWithZeroEverywhere) {
  torch::manual_seed(6);
  const int64_t B = 2, H = 4, T = 40;
  const auto q = torch::randn({B, H, T, 8}, torch::kFloat64), k = torch::randn({B, H, T, 8}, torch::kFloat64),
             v = torch::randn({B, H, T, 8}, torch::kFloat64);
  // Reads b and h: every key whose (kv + h + b) is not a multiple of 3, and the diagonal.
  const auto reads_bh = [](int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx) {
    return kv_idx == q_idx || (kv_idx + h + b) % 3 != 0;
  };
  const auto at_zero = [&](int64_t, int64_t, int64_t q_idx, int64_t kv_idx) { return reads_bh(0, 0, q_idx, kv_idx); };
  const auto want = dense(q, k, v, dense_mask(at_zero, B, H, T, T)).first;
  for (const int64_t bs : {1, 3, 8, 16, 64}) {
    SCOPED_TRACE(bs);
    const auto broadcast = torchattn::create_block_mask(reads_bh, 1, 1, T, T, bs);
    EXPECT_LE((torchattn::flex_attention(q, k, v, broadcast).output - want).abs().max().item<double>(), 1e-12);
    // float32 and the gradient's kernels ask it the same way.
    const auto qf = q.to(torch::kFloat).requires_grad_();
    const auto out = torchattn::flex_attention(qf, k.to(torch::kFloat), v.to(torch::kFloat), broadcast).output;
    EXPECT_LE((out.to(torch::kDouble) - want).abs().max().item<double>(), 2e-6);
  }
  // Made for B and H, it asks each.
  const auto per_head = torchattn::create_block_mask(reads_bh, B, H, T, T, 8);
  const auto own = dense(q, k, v, dense_mask(reads_bh, B, H, T, T)).first;
  EXPECT_LE((torchattn::flex_attention(q, k, v, per_head).output - own).abs().max().item<double>(), 1e-12);
}

// A hand-made or edited mask listing a key block twice for a query block, in one list or
// as both full and partial, would count its keys twice: refused.
TEST(FlexRefusals, AKeyBlockListedTwiceIsRefused) {
  const auto q = torch::randn({1, 1, 32, 8}), k = torch::randn({1, 1, 32, 8}), v = torch::randn({1, 1, 32, 8});
  const auto mask = torchattn::create_block_mask(CausalMask{}, 1, 1, 32, 32, 8);  // 4 x 4 blocks
  auto twice = mask;
  twice.kv_num_blocks = mask.kv_num_blocks.clone();
  twice.kv_indices = mask.kv_indices.clone();
  twice.kv_num_blocks[0][0][2] = 2;
  twice.kv_indices[0][0][2][0] = 2;
  twice.kv_indices[0][0][2][1] = 2;
  expect_error([&] { torchattn::flex_attention(q, k, v, twice); },
               "flex_attention: block_mask lists the key block 2 twice for query block 2 (batch 0, head 0): twice in "
               "kv_num_blocks");
  auto both = mask;
  both.kv_num_blocks = mask.kv_num_blocks.clone();
  both.kv_indices = mask.kv_indices.clone();
  // Query block 3 has key blocks 0, 1, 2 full and 3 partial: list 1 as partial too.
  ASSERT_EQ(mask.full_kv_num_blocks[0][0][3].item<int32_t>(), 3);
  both.kv_num_blocks[0][0][3] = 2;
  both.kv_indices[0][0][3][1] = 1;
  expect_error([&] { torchattn::flex_attention(q, k, v, both); },
               "flex_attention: block_mask lists the key block 1 twice for query block 3 (batch 0, head 0): as both "
               "full (full_kv_indices) and partial (kv_indices)");
  EXPECT_NO_THROW(torchattn::flex_attention(q, k, v, mask));
}

// The ready-made variants' tables against the call: each an error naming both numbers.
TEST(FlexRefusals, TheVariantsTablesAreCheckedAgainstTheCall) {
  torch::manual_seed(7);
  const auto q = torch::randn({1, 8, 20, 8}), k = torch::randn({1, 2, 20, 8}), v = torch::randn({1, 2, 20, 8});
  expect_error([&] { torchattn::flex_attention(q, k, v, flex::Alibi(4)); },
               "flex::Alibi: has 4 slopes, but q has 8 heads; expected one slope per query head");
  EXPECT_NO_THROW(torchattn::flex_attention(q, k, v, flex::Alibi(8)));
  expect_error([&] { torchattn::flex_attention(q, k, v, flex::RelativeBias(torch::randn({2, 9}))); },
               "flex::RelativeBias: the table has 2 rows, but q has 8 heads; expected 1 row (every head) or one per "
               "query head");
  EXPECT_NO_THROW(torchattn::flex_attention(q, k, v, flex::RelativeBias(torch::randn({1, 9}))));
  EXPECT_NO_THROW(torchattn::flex_attention(q, k, v, flex::RelativeBias(torch::randn({8, 9}))));
  // Documents of 30 tokens over 20 keys: at create_block_mask, and inside a combination.
  const flex::Documents docs(std::vector<int64_t>{0, 10, 30});
  expect_error([&] { torchattn::create_block_mask(docs, 1, 1, 20, 20); },
               "flex::Documents: cu_seqlens covers 30 tokens, but the keys are 20 and the queries 20 long");
  expect_error([&] { torchattn::create_block_mask(flex::and_masks(docs, flex::SlidingWindow(4)), 1, 1, 20, 20); },
               "flex::Documents: cu_seqlens covers 30 tokens");
  const flex::Documents fits(std::vector<int64_t>{0, 10, 20});
  EXPECT_NO_THROW(torchattn::flex_attention(q, k, v, torchattn::create_block_mask(fits, 1, 1, 20, 20)));
}

// The log-sum-exp carries its gradient (as PyTorch's flex on CUDA): a loss of both, in
// float64 and float32, against ATen's autograd through the same math, grouped heads.
TEST(FlexRefusals, TheLogSumExpCarriesItsGradient) {
  torch::manual_seed(8);
  for (const auto dtype : {torch::kFloat64, torch::kFloat32}) {
    SCOPED_TRACE(dtype == torch::kFloat64 ? "f64" : "f32");
    const double bound = dtype == torch::kFloat64 ? 1e-12 : 2e-5;
    const auto q0 = torch::randn({2, 4, 37, 16}, torch::kFloat64), k0 = torch::randn({2, 2, 37, 16}, torch::kFloat64),
               v0 = torch::randn({2, 2, 37, 16}, torch::kFloat64), w = torch::randn({2, 4, 37}, torch::kFloat64);
    const auto mask = torchattn::create_block_mask(CausalMask{}, 1, 1, 37, 37, 16);
    const auto leaf = [&](const torch::Tensor& t) { return t.to(dtype).detach().clone().requires_grad_(); };
    auto q = leaf(q0), k = leaf(k0), v = leaf(v0);
    const auto r = torchattn::flex_attention(q, k, v, flex::Softcap(5.0), mask, torchattn::FlexOptions().with_lse());
    ASSERT_TRUE(r.lse.requires_grad());
    (r.lse * w.to(dtype)).sum().add(r.output.sum() * 0.5).backward();
    auto qr = q0.detach().clone().requires_grad_(), kr = k0.detach().clone().requires_grad_(),
         vr = v0.detach().clone().requires_grad_();
    const int64_t group = 2;
    auto s = torch::matmul(qr, kr.repeat_interleave(group, 1).transpose(-1, -2)) / 4.0;
    s = 5.0 * torch::tanh(s / 5.0);
    s = s.masked_fill(torch::ones({37, 37}, torch::kBool).triu(1), -std::numeric_limits<double>::infinity());
    const auto out = torch::matmul(torch::softmax(s, -1), vr.repeat_interleave(group, 1));
    (torch::logsumexp(s, -1) * w).sum().add(out.sum() * 0.5).backward();
    for (const auto& [got, want] : {std::pair{q, qr}, {k, kr}, {v, vr}}) {
      EXPECT_LE(
          ((got.grad().to(torch::kDouble) - want.grad()).abs() / want.grad().abs().clamp_min(1.0)).max().item<double>(),
          bound);
    }
  }
}

// A backward through flex_attention's gradients: an error naming flex_attention (the
// gradients themselves, with create_graph, are the same).
TEST(FlexRefusals, ADoubleBackwardIsAnErrorNamingFlex) {
  torch::manual_seed(9);
  const auto q = torch::randn({1, 2, 10, 8}, torch::kFloat64).requires_grad_();
  const auto k = torch::randn({1, 2, 10, 8}, torch::kFloat64), v = torch::randn({1, 2, 10, 8}, torch::kFloat64);
  const auto mask = torchattn::create_block_mask(CausalMask{}, 1, 1, 10, 10, 4);
  const auto once = torch::autograd::grad({torchattn::flex_attention(q, k, v, mask).output.pow(2).sum()}, {q});
  const auto graph = torch::autograd::grad({torchattn::flex_attention(q, k, v, mask).output.pow(2).sum()}, {q}, {},
                                           /*retain_graph=*/true, /*create_graph=*/true);
  EXPECT_TRUE(torch::equal(once[0], graph[0].detach()));
  ASSERT_TRUE(graph[0].requires_grad());
  expect_error([&] { graph[0].sum().backward(); }, "flex_attention: no double backward");
}

// The right forms of flex_signatures.cpp (whose slips must not compile) compile and run.
TEST(FlexRefusals, TheRightSignaturesCompileAndRun) {
  torch::manual_seed(10);
  const auto q = torch::randn({1, 2, 9, 8}), k = torch::randn({1, 2, 9, 8}), v = torch::randn({1, 2, 9, 8});
  const auto out = flex_signatures::run(q, k, v);
  EXPECT_EQ(out.sizes(), q.sizes());
  EXPECT_TRUE(torch::isfinite(out).all().item<bool>());
}

}  // namespace flex_refusals_test

// The causal prefill on the CPU, flex's kernels under flex::Causal (the table's
// cpu_flex_causal, backends/selector.cpp): through backends::attend against ATen's math
// in float64 over shapes (tiles of rows and keys, blocks of the block mask, chunks after
// earlier keys, grouped heads, head sizes), strided views and threads, on the
// instruction set the process runs (ctest's unit_isa_* cap it); a key hidden from a row
// never reaches it; what the path applies to. And flex::RangedMask, which it rests on:
// each ready-made mask's run of keys is its mask_mod's, and a block mask made from the
// runs is the one made by asking per key.

#include "backends/attend.h"
#include "backends/selector.h"

#include <torchattn/detail/kernels/cpu/cpu_features.h>
#include <torchattn/flex/block_mask.h>
#include <torchattn/flex/variants.h>
#include <torchattn/flex_attention.h>

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace K = torchattn::kernels::cpu;
using torchattn::backends::MaskSpec;
using torchattn::functional::AttentionOptions;

bool vector_isa() { return K::best_isa() >= K::Isa::Avx2; }

// softmax(q k^T * scale) v in float64, row t seeing keys 0 .. t + Tk - Tq, key heads
// repeated for grouped queries.
torch::Tensor causal_math(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double scale) {
  const int64_t G = q.size(1) / k.size(1), Tq = q.size(2), Tk = k.size(2);
  auto kk = k.to(torch::kFloat64).repeat_interleave(G, 1), vv = v.to(torch::kFloat64).repeat_interleave(G, 1);
  auto s = torch::matmul(q.to(torch::kFloat64), kk.transpose(-2, -1)) * scale;
  const auto hidden = torch::ones({Tq, Tk}, torch::kBool).triu(Tk - Tq + 1);
  return torch::matmul(torch::softmax(s.masked_fill(hidden, -INFINITY), -1), vv);
}

// A causal call of Tq rows after Tk - Tq earlier keys, as the modules make it.
MaskSpec causal_spec(int64_t Tq, int64_t Tk) {
  MaskSpec spec;
  spec.causal = true;
  spec.past = Tk - Tq;
  return spec;
}

std::vector<std::string> path_of(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  return torchattn::backends::explain(q, k, v, causal_spec(q.size(2), k.size(2)), AttentionOptions{});
}

struct CausalCase {
  int64_t B, H, Hkv, Tq, Tk, d, dv;
  bool strided;
};

std::string describe(const CausalCase& c) {
  // A stream, not string operator+ chains: GCC 12 at -O3 warns inside libstdc++'s
  // operator+(const char*, std::string&&) where nothing overflows (its bug 105651).
  std::ostringstream out;
  out << K::isa_name(K::best_isa()) << " B" << c.B << " H" << c.H << "/" << c.Hkv << " Tq" << c.Tq << " Tk" << c.Tk
      << " d" << c.d << "/" << c.dv << (c.strided ? " strided" : "");
  return out.str();
}

std::vector<CausalCase> cases() {
  std::vector<CausalCase> out;
  // Rows around the tiles (4 and 8) and past a decoding step (16), keys around the
  // score tiles (16 and 32) and the block mask's blocks (128).
  for (const int64_t Tq : {int64_t{17}, int64_t{33}, int64_t{130}}) {
    for (const int64_t past : {int64_t{0}, int64_t{3}, int64_t{40}, int64_t{126}}) {
      for (const auto& [H, Hkv] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {9, 3}, {4, 1}}) {
        out.push_back({2, H, Hkv, Tq, Tq + past, 64, 64, (Tq + past + H) % 2 == 0});
      }
    }
  }
  out.push_back({1, 2, 2, 17, 17, 5, 16, false});       // a head size of no vector width
  out.push_back({1, 3, 1, 40, 41, 40, 80, true});       // d != dv, a last column tile of one vector
  out.push_back({1, 2, 2, 20, 20, 16, 9, false});       // dv of no vector width
  out.push_back({1, 2, 1, 300, 300, 128, 128, false});  // Llama's heads, two column tiles
  out.push_back({1, 9, 3, 512, 512, 64, 64, false});    // SmolLM2's prefill of 512
  return out;
}

TEST(CausalFlex, MatchesTheMathThroughTheTable) {
  int checked = 0;
  for (const auto& c : cases()) {
    SCOPED_TRACE(describe(c));
    torch::manual_seed(checked);
    torch::Tensor q = torch::randn({c.B, c.H, c.Tq, c.d});
    torch::Tensor k = torch::randn({c.B, c.Hkv, c.Tk, c.d}), v = torch::randn({c.B, c.Hkv, c.Tk, c.dv});
    if (c.strided) {
      // Views, as a layer's projections are: [B, T, H, d] transposed, a cache's rows.
      q = torch::randn({c.B, c.Tq, c.H, c.d}).transpose(1, 2);
      k = torch::randn({c.B, c.Hkv, c.Tk + 5, c.d}).narrow(2, 3, c.Tk);
      v = torch::randn({c.B, c.Tk, c.Hkv, c.dv}).transpose(1, 2);
    }
    const std::vector<std::string> want_path =
        vector_isa() ? std::vector<std::string>{"cpu_flex_causal"} : std::vector<std::string>{"masks_as_aten"};
    const auto path = path_of(q, k, v);
    ASSERT_FALSE(path.empty());
    EXPECT_EQ(path.front(), want_path.front());
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
    const auto out = torchattn::backends::attend(q, k, v, causal_spec(c.Tq, c.Tk), AttentionOptions{});
    ASSERT_EQ(out.sizes(), (std::vector<int64_t>{c.B, c.H, c.Tq, c.dv}));
    EXPECT_LT((out.to(torch::kFloat64) - causal_math(q, k, v, scale)).abs().max().item<double>(), 2e-6);
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(cases().size()));
}

// A key hidden from a row adds nothing to it, even a value of inf: the rows before an
// inf value are those of the same values with a finite one there, bit for bit, a key
// inside a tile of rows and a tile of keys, in a whole block and in a partial one.
TEST(CausalFlex, AKeyHiddenFromARowNeverReachesIt) {
  for (const int64_t past : {int64_t{0}, int64_t{3}, int64_t{150}}) {
    SCOPED_TRACE("past " + std::to_string(past));
    torch::manual_seed(11);
    const int64_t Tq = 29, Tk = Tq + past, at_key = past + 6;  // first seen by query row 6
    const auto q = torch::randn({1, 2, Tq, 16}), k = torch::randn({1, 2, Tk, 16});
    auto v = torch::randn({1, 2, Tk, 16});
    const auto finite = torchattn::backends::attend(q, k, v, causal_spec(Tq, Tk), AttentionOptions{});
    v.select(2, at_key).fill_(INFINITY);
    const auto out = torchattn::backends::attend(q, k, v, causal_spec(Tq, Tk), AttentionOptions{});
    EXPECT_TRUE(torch::equal(out.narrow(2, 0, 6), finite.narrow(2, 0, 6)));
    EXPECT_TRUE(out.narrow(2, 0, 6).isfinite().all().item<bool>());
    EXPECT_FALSE(out.narrow(2, 6, Tq - 6).isfinite().any().item<bool>());  // the rows that see it
  }
}

// Every output is one task's, so the threads' split changes no bit; and at Tq == Tk the
// result is ATen's causal SDPA within float32 rounding.
TEST(CausalFlex, ThreadsChangeNoBitAndAtenAgrees) {
  torch::manual_seed(7);
  const auto q = torch::randn({1, 9, 200, 64}), k = torch::randn({1, 3, 200, 64}), v = torch::randn({1, 3, 200, 64});
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const auto one = torchattn::backends::attend(q, k, v, causal_spec(200, 200), AttentionOptions{});
  at::set_num_threads(std::max(2, threads));
  const auto many = torchattn::backends::attend(q, k, v, causal_spec(200, 200), AttentionOptions{});
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(one, many));
  const auto aten = at::scaled_dot_product_attention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), {}, 0.0,
                                                     /*is_causal=*/true, 0.125);
  EXPECT_LT((one - aten).abs().max().item<float>(), 2e-6f);
}

// The path takes float32 causal calls with nothing to differentiate; the others go on
// down the table.
TEST(CausalFlex, AppliesOnlyToWhatItComputes) {
  const auto q = torch::randn({1, 2, 20, 8}), k = torch::randn({1, 2, 23, 8}), v = torch::randn({1, 2, 23, 16});
  const std::string flex = "cpu_flex_causal";
  EXPECT_EQ(path_of(q, k, v).back() == flex, vector_isa());
  EXPECT_NE(path_of(q.to(torch::kFloat64), k.to(torch::kFloat64), v.to(torch::kFloat64)).back(), flex);
  EXPECT_NE(path_of(q.to(torch::kBFloat16), k.to(torch::kBFloat16), v.to(torch::kBFloat16)).back(), flex);
  EXPECT_NE(path_of(q.clone().requires_grad_(), k, v).back(), flex);  // autograd: ATen's
  EXPECT_NE(path_of(q, k, v.clone().requires_grad_()).back(), flex);
  const auto decoding = torch::randn({1, 2, 16, 8});  // a decoding step's rows after cached keys
  EXPECT_NE(path_of(decoding, k, v).back(), flex);
  torch::NoGradGuard no_grad;
  EXPECT_EQ(path_of(q.clone().requires_grad_(), k, v).back() == flex, vector_isa());
}

// Each ready-made mask's keys(q_idx) is the run its mask_mod sees, at every query, over
// lengths and offsets that cut the runs at both ends.
TEST(RangedMasks, EachRunIsWhatTheMaskModSees) {
  namespace F = torchattn::flex;
  const int64_t Tq = 23, Tk = 40;
  auto expect_runs = [&](const auto& mask, const std::string& name, int64_t q_len, int64_t kv_len) {
    static_assert(F::RangedMask<std::decay_t<decltype(mask)>>);
    for (int64_t i = 0; i < q_len; ++i) {
      const F::KeyRange run = mask.keys(i);
      for (int64_t j = 0; j < kv_len; ++j) {
        ASSERT_EQ(mask(1, 2, i, j), run.begin <= j && j < run.end) << name << " query " << i << " key " << j;
      }
    }
  };
  for (const int64_t offset : {int64_t{0}, Tk - Tq}) {
    const std::string at = " offset " + std::to_string(offset);
    expect_runs(F::Causal(offset), "Causal" + at, Tq, Tk);
    expect_runs(F::SlidingWindow(5, offset), "SlidingWindow(5)" + at, Tq, Tk);
    expect_runs(F::SlidingWindow(1, offset), "SlidingWindow(1)" + at, Tq, Tk);
    expect_runs(F::PrefixLM(12, offset), "PrefixLM(12)" + at, Tq, Tk);
    expect_runs(F::PrefixLM(0, offset), "PrefixLM(0)" + at, Tq, Tk);
    expect_runs(F::and_masks(F::Causal(offset), F::SlidingWindow(7, offset)), "Causal & SlidingWindow" + at, Tq, Tk);
  }
  const std::vector<int64_t> cu{0, 5, 6, 19, 30};
  expect_runs(F::Documents(cu), "Documents causal", 30, 30);
  expect_runs(F::Documents(cu, /*causal=*/false), "Documents", 30, 30);
  expect_runs(F::and_masks(F::Documents(cu), F::SlidingWindow(4)), "Documents & SlidingWindow", 30, 30);
  expect_runs(torchattn::VisibleKeys{}, "VisibleKeys", Tq, Tk);
  // The composed mask of a flex variant: the module's causal mask and window at a call's
  // positions over the user's mask.
  expect_runs(F::MaskAtPositions<F::PrefixLM>{F::PrefixLM(9), 6, true, 4}, "MaskAtPositions(PrefixLM)", Tq - 6,
              Tk);
  expect_runs(F::MaskAtPositions<torchattn::VisibleKeys>{{}, 3, true, 0}, "MaskAtPositions(VisibleKeys)", Tq, Tk);
}

// create_block_mask counts a RangedMask's blocks from its runs: the same block mask as
// asking the same mask key by key (a lambda, which names no run), at block sizes that
// cut the runs anywhere.
TEST(RangedMasks, TheirBlockMasksAreThoseMadeKeyByKey) {
  namespace F = torchattn::flex;
  auto same = [](const auto& ranged, const std::string& name, int64_t q_len, int64_t kv_len) {
    const auto asked = [ranged](int64_t b, int64_t h, int64_t i, int64_t j) { return ranged(b, h, i, j); };
    for (const int64_t bs : {int64_t{1}, int64_t{7}, int64_t{16}, int64_t{128}}) {
      SCOPED_TRACE(name + " block_size " + std::to_string(bs));
      const auto a = torchattn::create_block_mask(ranged, 1, 1, q_len, kv_len, bs);
      const auto b = torchattn::create_block_mask(asked, 1, 1, q_len, kv_len, bs);
      EXPECT_TRUE(torch::equal(a.kv_num_blocks, b.kv_num_blocks));
      EXPECT_TRUE(torch::equal(a.full_kv_num_blocks, b.full_kv_num_blocks));
      // Indices past a row's counts are unspecified: compare the counted ones.
      for (int64_t qb = 0; qb < a.shape.q_blocks(); ++qb) {
        const auto ka = a.key_blocks(0, 0, qb), kb = b.key_blocks(0, 0, qb);
        for (int kind = 0; kind < 2; ++kind) {
          for (int32_t c = 0; c < ka.count[kind]; ++c) EXPECT_EQ(ka.index[kind][c], kb.index[kind][c]);
        }
      }
    }
  };
  same(F::Causal(), "Causal", 70, 70);
  same(F::Causal(33), "Causal(33)", 37, 70);
  same(F::SlidingWindow(9, 4), "SlidingWindow(9)", 66, 70);
  same(F::PrefixLM(20), "PrefixLM(20)", 70, 70);
  same(F::Documents(std::vector<int64_t>{0, 10, 11, 45, 70}), "Documents", 70, 70);
  same(F::and_masks(F::Causal(), F::SlidingWindow(13)), "Causal & SlidingWindow", 70, 70);
}

}  // namespace

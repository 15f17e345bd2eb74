// The causal prefill on the CPU, flex's kernels under flex::Causal (the table's
// cpu_flex_causal, backends/selector.cpp): through backends::attend against ATen's math
// in float64 over shapes (tiles of rows and keys, blocks of the block mask, chunks after
// earlier keys, grouped heads, head sizes), strided views and threads, on the
// instruction set the process runs (ctest's unit_isa_* cap it); a key hidden from a row
// never reaches it; what the path applies to. (flex::RangedMask, which it rests on:
// test_flex_variants.cpp.)

#include "backends/attend.h"
#include "backends/named_flex.h"
#include "backends/selector.h"

#include <torchattn/detail/kernels/cpu/cpu_features.h>

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
    const std::vector<std::string> want_path = vector_isa() ? std::vector<std::string>{"cpu_flex_causal"}
                                                            : std::vector<std::string>{"masks_as_aten"};
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

// The path's flex instance (named_flex_attention, as cpu_flex_causal runs it), on every
// instruction set (also where the table takes ATen's kernel instead: without AVX2).
at::Tensor causal_flex(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  return torchattn::backends::named_flex_attention(q, k, v, causal_spec(q.size(2), k.size(2)), AttentionOptions{});
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
    const auto finite = causal_flex(q, k, v);
    v.select(2, at_key).fill_(INFINITY);
    const auto out = causal_flex(q, k, v);
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
  const auto one = causal_flex(q, k, v);
  at::set_num_threads(std::max(2, threads));
  const auto many = causal_flex(q, k, v);
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

}  // namespace

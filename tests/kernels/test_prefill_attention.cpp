// prefill_attention against ATen's math in float64 over shapes (block and tile edges,
// chunks after earlier keys, grouped heads, head sizes), strided views, every
// instruction set this CPU runs and threads; against ATen's fused kernel; what it
// applies to; and its errors.

#include "kernels/cpu/prefill_attention.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace K = torchattn::kernels::cpu;

// softmax(q k^T * scale) v in float64, row t seeing keys 0 .. t + Tk - Tq, key heads
// repeated for grouped queries.
torch::Tensor causal_math(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double scale) {
  const int64_t G = q.size(1) / k.size(1), Tq = q.size(2), Tk = k.size(2);
  auto kk = k.to(torch::kFloat64).repeat_interleave(G, 1), vv = v.to(torch::kFloat64).repeat_interleave(G, 1);
  auto s = torch::matmul(q.to(torch::kFloat64), kk.transpose(-2, -1)) * scale;
  const auto hidden = torch::ones({Tq, Tk}, torch::kBool).triu(Tk - Tq + 1);
  return torch::matmul(torch::softmax(s.masked_fill(hidden, -INFINITY), -1), vv);
}

struct PrefillCase {
  int64_t B, H, Hkv, Tq, Tk, d, dv;
  bool strided;
};

std::string describe(const PrefillCase& c) {
  // A stream, not string operator+ chains: GCC 12 at -O3 warns inside libstdc++'s
  // operator+(const char*, std::string&&) where nothing overflows (its bug 105651).
  std::ostringstream out;
  out << "B" << c.B << " H" << c.H << "/" << c.Hkv << " Tq" << c.Tq << " Tk" << c.Tk << " d" << c.d << "/" << c.dv
      << (c.strided ? " strided" : "");
  return out.str();
}

std::vector<PrefillCase> cases() {
  std::vector<PrefillCase> out;
  // Rows around the blocks (4 and 8) and keys around the tiles (16 and 32).
  for (const int64_t Tq : {int64_t{1}, int64_t{5}, int64_t{8}, int64_t{9}, int64_t{33}, int64_t{130}}) {
    for (const int64_t past : {int64_t{0}, int64_t{3}, int64_t{40}}) {
      for (const auto& [H, Hkv] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {9, 3}, {4, 1}}) {
        out.push_back({2, H, Hkv, Tq, Tq + past, 64, 64, (Tq + past + H) % 2 == 0});
      }
    }
  }
  out.push_back({1, 2, 2, 17, 17, 5, 16, false});       // a head size of no vector width
  out.push_back({1, 3, 1, 40, 41, 40, 80, true});       // d != dv, a last column tile of one vector
  out.push_back({1, 2, 1, 300, 300, 128, 128, false});  // Llama's heads, two column tiles
  out.push_back({1, 9, 3, 512, 512, 64, 64, false});    // SmolLM2's prefill of 512
  return out;
}

TEST(PrefillAttention, MatchesTheMathOnEveryInstructionSet) {
  int checked = 0;
  for (const K::Isa isa : K::supported_isas()) {
    for (const auto& c : cases()) {
      SCOPED_TRACE(std::string(K::isa_name(isa)) + " " + describe(c));
      torch::manual_seed(checked);
      torch::Tensor q = torch::randn({c.B, c.H, c.Tq, c.d});
      torch::Tensor k = torch::randn({c.B, c.Hkv, c.Tk, c.d}), v = torch::randn({c.B, c.Hkv, c.Tk, c.dv});
      if (c.strided) {
        // Views, as a layer's projections are: [B, T, H, d] transposed, a cache's rows.
        q = torch::randn({c.B, c.Tq, c.H, c.d}).transpose(1, 2);
        k = torch::randn({c.B, c.Hkv, c.Tk + 5, c.d}).narrow(2, 3, c.Tk);
        v = torch::randn({c.B, c.Tk, c.Hkv, c.dv}).transpose(1, 2);
      }
      const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
      const auto out = K::prefill_attention(q, k, v, scale, isa);
      ASSERT_EQ(out.sizes(), (std::vector<int64_t>{c.B, c.H, c.Tq, c.dv}));
      EXPECT_LT((out.to(torch::kFloat64) - causal_math(q, k, v, scale)).abs().max().item<double>(), 2e-6);
      ++checked;
    }
  }
  EXPECT_EQ(checked, static_cast<int>(K::supported_isas().size() * cases().size()));
}

// A key hidden from a row adds nothing to it, even a value of inf: the rows before an
// inf value are those of the same values with a finite one there, bit for bit, on
// every instruction set, a key inside a block of rows and a tile of keys.
TEST(PrefillAttention, AKeyHiddenFromARowNeverReachesIt) {
  for (const K::Isa isa : K::supported_isas()) {
    for (const int64_t past : {int64_t{0}, int64_t{3}}) {
      SCOPED_TRACE(std::string(K::isa_name(isa)) + " past " + std::to_string(past));
      torch::manual_seed(11);
      const int64_t Tq = 13, Tk = Tq + past, at_key = past + 6;  // first seen by query row 6
      const auto q = torch::randn({1, 2, Tq, 16}), k = torch::randn({1, 2, Tk, 16});
      auto v = torch::randn({1, 2, Tk, 16});
      const auto finite = K::prefill_attention(q, k, v, 0.25, isa);
      v.select(2, at_key).fill_(INFINITY);
      const auto out = K::prefill_attention(q, k, v, 0.25, isa);
      EXPECT_TRUE(torch::equal(out.narrow(2, 0, 6), finite.narrow(2, 0, 6)));
      EXPECT_TRUE(out.narrow(2, 0, 6).isfinite().all().item<bool>());
      EXPECT_FALSE(out.narrow(2, 6, Tq - 6).isfinite().any().item<bool>());  // the rows that see it
    }
  }
}

// Every output is one task's, so the threads' split changes no bit; and at Tq == Tk the
// result is ATen's causal SDPA within float32 rounding.
TEST(PrefillAttention, ThreadsChangeNoBitAndAtenAgrees) {
  torch::manual_seed(7);
  const auto q = torch::randn({1, 9, 200, 64}), k = torch::randn({1, 3, 200, 64}), v = torch::randn({1, 3, 200, 64});
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const auto one = K::prefill_attention(q, k, v, 0.125);
  at::set_num_threads(std::max(2, threads));
  const auto many = K::prefill_attention(q, k, v, 0.125);
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(one, many));
  const auto aten = at::scaled_dot_product_attention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), {}, 0.0,
                                                     /*is_causal=*/true, 0.125);
  EXPECT_LT((one - aten).abs().max().item<float>(), 2e-6f);
}

TEST(PrefillAttention, AppliesOnlyToWhatItComputes) {
  const auto q = torch::randn({1, 2, 6, 8}), k = torch::randn({1, 2, 9, 8}), v = torch::randn({1, 2, 9, 16});
  const bool vector = K::best_isa() >= K::Isa::Avx2;
  EXPECT_EQ(K::prefill_attention_applies(q, k, v), vector);
  EXPECT_FALSE(K::prefill_attention_applies(q.to(torch::kFloat64), k, v));        // float32 only
  EXPECT_FALSE(K::prefill_attention_applies(torch::randn({1, 2, 10, 8}), k, v));  // more queries than keys
  EXPECT_FALSE(K::prefill_attention_applies(torch::randn({1, 3, 6, 8}), k, v));   // heads not a multiple
  EXPECT_FALSE(K::prefill_attention_applies(q, k, torch::randn({1, 2, 9, 8})));   // dv not a multiple of 16
  EXPECT_FALSE(K::prefill_attention_applies(q, k.transpose(2, 3).contiguous().transpose(2, 3), v));  // strided d
  EXPECT_FALSE(K::prefill_attention_applies(q.clone().requires_grad_(), k, v));                      // autograd: ATen
  torch::NoGradGuard no_grad;
  EXPECT_EQ(K::prefill_attention_applies(q.clone().requires_grad_(), k, v), vector);
}

TEST(PrefillAttention, RefusesWhatItDoesNotCompute) {
  const auto q = torch::randn({1, 2, 6, 8}), k = torch::randn({1, 2, 9, 8}), v = torch::randn({1, 2, 9, 16});
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] {
              K::prefill_attention(torch::randn({1, 2, 10, 8}), k, v, 0.5);
            }).find("1 <= Tq <= Tk and dv a multiple of 16, got q [1, 2, 10, 8]"),
            std::string::npos);
  EXPECT_NE(message([&] { K::prefill_attention(q.to(torch::kFloat64), k, v, 0.5); }).find("expected float32 CPU q"),
            std::string::npos);
  EXPECT_NE(message([&] { K::prefill_attention(q, k, v, 0.0); }).find("expected a finite scale > 0, got 0"),
            std::string::npos);
  EXPECT_NE(message([&] { K::prefill_attention(q.clone().requires_grad_(), k, v, 0.5); }).find("computes no gradient"),
            std::string::npos);
}

}  // namespace

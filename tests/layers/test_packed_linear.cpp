// PackedLinear (oneDNN-packed weights for CPU inference) against at::linear over shapes,
// fused weights and biases; each row the same bits alone or in a batch; the packed copy
// follows weights written in place or replaced; what it refuses, with its message; and
// MultiHeadAttention's pack_weights option against the unpacked module.

#include "common/expect_error.h"
#include "common/tolerances.h"

#include <torchattn/multi_head_attention.h>
#include <torchattn/packed_linear.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>
#include <thread>
#include <vector>

namespace {

using torchattn::PackedLinear;

// Sums of `in` products in another order than MKL's: float32 rounding grows with in.
tol::Tolerance rounding(int64_t in) { return {1e-5, 1e-6 * static_cast<double>(in)}; }

TEST(PackedLinear, MatchesAtLinearOverShapesAndFusedWeights) {
  torch::manual_seed(21);
  torch::NoGradGuard no_grad;
  for (const int64_t rows : {1, 7, 29, 300}) {
    for (const int64_t in : {1, 16, 384}) {
      SCOPED_TRACE(std::to_string(rows) + " rows of " + std::to_string(in));
      const auto x = torch::randn({rows, in});
      const auto w1 = torch::randn({48, in}), w2 = torch::randn({16, in}), w3 = torch::randn({16, in});
      const auto b1 = torch::randn({48}), b3 = torch::randn({16});
      PackedLinear one, none, three, mixed;
      EXPECT_TRUE(tol::close(one.forward(x, {w1}, {b1}), torch::linear(x, w1, b1), rounding(in)));
      EXPECT_TRUE(tol::close(none.forward(x, {w1}), torch::linear(x, w1), rounding(in)));
      // Three layers side by side, as W_query | W_key | W_value.
      const auto want = torch::cat({torch::linear(x, w1, b1), torch::linear(x, w2), torch::linear(x, w3, b3)}, -1);
      EXPECT_TRUE(tol::close(mixed.forward(x, {w1, w2, w3}, {b1, {}, b3}), want, rounding(in)));
      const auto want_nobias = torch::cat({torch::linear(x, w1), torch::linear(x, w2), torch::linear(x, w3)}, -1);
      EXPECT_TRUE(tol::close(three.forward(x, {w1, w2, w3}), want_nobias, rounding(in)));
    }
  }
  // Leading dimensions are kept, and a non-contiguous x is read as it is.
  PackedLinear p;
  const auto w = torch::randn({10, 6});
  EXPECT_EQ(p.forward(torch::randn({2, 3, 6}), {w}).sizes(), (std::vector<int64_t>{2, 3, 10}));
  const auto xt = torch::randn({6, 20}).t();
  EXPECT_TRUE(tol::close(p.forward(xt, {w}), torch::linear(xt, w), rounding(6)));
}

TEST(PackedLinear, EachRowIsTheSameAloneOrInABatch) {
  torch::manual_seed(22);
  torch::NoGradGuard no_grad;
  const auto w = torch::randn({96, 64}), b = torch::randn({96}), x = torch::randn({40, 64});
  PackedLinear p;
  const auto batch = p.forward(x, {w}, {b});
  for (const int64_t first : {0, 5, 39}) {
    for (const int64_t count : {1, 2, 9}) {
      if (first + count > x.size(0)) continue;
      const auto part = p.forward(x.narrow(0, first, count), {w}, {b});
      EXPECT_TRUE(torch::equal(part, batch.narrow(0, first, count))) << first << "+" << count;
    }
  }
}

TEST(PackedLinear, FollowsWeightsWrittenOrReplaced) {
  torch::manual_seed(23);
  torch::NoGradGuard no_grad;
  auto w = torch::randn({8, 5}), b = torch::randn({8});
  const auto x = torch::randn({12, 5});
  PackedLinear p;
  EXPECT_EQ(p.packed_bytes(), 0);
  EXPECT_TRUE(tol::close(p.forward(x, {w}, {b}), torch::linear(x, w, b), rounding(5)));
  EXPECT_EQ(p.packed_bytes(), (8 * 5 + 8) * 4);
  w.mul_(2);  // an optimizer step, a load_state_dict: in place
  EXPECT_TRUE(tol::close(p.forward(x, {w}, {b}), torch::linear(x, w, b), rounding(5)));
  b.zero_();
  EXPECT_TRUE(tol::close(p.forward(x, {w}, {b}), torch::linear(x, w), rounding(5)));
  w = torch::randn({8, 5});  // another tensor
  EXPECT_TRUE(tol::close(p.forward(x, {w}, {b}), torch::linear(x, w), rounding(5)));
  // Other weights (here: a second layer side by side) are a new packed copy too.
  const auto w2 = torch::randn({3, 5});
  EXPECT_TRUE(
      tol::close(p.forward(x, {w, w2}), torch::cat({torch::linear(x, w), torch::linear(x, w2)}, -1), rounding(5)));
  EXPECT_EQ(p.packed_bytes(), (8 + 3) * 5 * 4);
  p.clear();
  EXPECT_EQ(p.packed_bytes(), 0);
}

TEST(PackedLinear, ConcurrentForwardsAgree) {
  torch::manual_seed(24);
  torch::NoGradGuard no_grad;
  const auto w = torch::randn({64, 32}), x = torch::randn({20, 32});
  PackedLinear p;
  std::vector<torch::Tensor> out(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < out.size(); ++i) {
    threads.emplace_back([&, i] {
      torch::NoGradGuard inner;
      for (int r = 0; r < 20; ++r) out[i] = p.forward(x, {w});
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& o : out) EXPECT_TRUE(torch::equal(o, out[0]));
  EXPECT_TRUE(tol::close(out[0], torch::linear(x, w), rounding(32)));
}

TEST(PackedLinear, AppliesOnlyToWhatItComputesAndSaysWhy) {
  const auto w = torch::randn({8, 4}), x = torch::randn({3, 4});
  {
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(PackedLinear::applies(x, {w}));
    EXPECT_FALSE(PackedLinear::applies(x.to(torch::kDouble), {w.to(torch::kDouble)}));  // float32 only
    EXPECT_FALSE(PackedLinear::applies(x, {w.t().contiguous().t()}));                   // a dense [out, in]
    EXPECT_FALSE(PackedLinear::applies(x, {}));                                         // no weight
    EXPECT_FALSE(PackedLinear::applies(x, {w, w}, {torch::randn({8})}));                // a bias for each or none
    EXPECT_FALSE(PackedLinear::applies(torch::randn({3, 5}), {w}));                     // x of another width
    EXPECT_FALSE(PackedLinear::applies(torch::randn({0, 4}), {w}));                     // no rows
    PackedLinear p;
    expect_error([&] { p.forward(x.to(torch::kDouble), {w.to(torch::kDouble)}); },
                 "PackedLinear: expected float32 CPU x [..., in]");
    expect_error([&] { p.forward(x, {w, w}, {torch::randn({8})}); }, "expected no biases or one per weight (2), got 1");
  }
  // A gradient to compute: at::linear's business.
  EXPECT_FALSE(PackedLinear::applies(x, {w.clone().requires_grad_(true)}));
  EXPECT_FALSE(PackedLinear::applies(x.clone().requires_grad_(true), {w}));
}

TEST(PackedLinear, MultiHeadAttentionPackWeightsMatchesTheUnpackedModule) {
  for (const bool grouped : {false, true}) {
    SCOPED_TRACE(grouped ? "grouped, rope, no biases" : "biases");
    torch::manual_seed(25);
    auto options = torchattn::MultiHeadAttentionOptions(32, 32, 64, 4).qkv_bias(!grouped).out_bias(!grouped);
    if (grouped) options.num_kv_heads(2).rope(torchattn::RoPEOptions(10000.0));
    torchattn::MultiHeadAttention plain(options);
    torchattn::MultiHeadAttention packed(
        torchattn::MultiHeadAttentionOptions(options).projections({.pack = {.on = true}}));
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < plain->parameters().size(); ++i) packed->parameters()[i].copy_(plain->parameters()[i]);
    }
    plain->eval();
    packed->eval();
    const auto x = torch::randn({2, 20, 32});
    const auto pad = torch::zeros({2, 20}, torch::kBool).index_put_({0, torch::indexing::Slice(0, 3)}, true);
    {
      torch::NoGradGuard no_grad;
      EXPECT_TRUE(tol::close(packed(x, pad), plain(x, pad), rounding(32)));
      // Cached decoding: a prompt, then single tokens.
      auto c1 = plain->make_kv_cache(2), c2 = packed->make_kv_cache(2);
      EXPECT_TRUE(tol::close(packed->forward_cached(x.narrow(1, 0, 12), c2, pad.narrow(1, 0, 12)),
                             plain->forward_cached(x.narrow(1, 0, 12), c1, pad.narrow(1, 0, 12)), rounding(32)));
      for (int64_t t = 12; t < 20; ++t) {
        EXPECT_TRUE(tol::close(packed->forward_cached(x.narrow(1, t, 1), c2),
                               plain->forward_cached(x.narrow(1, t, 1), c1), rounding(32)));
      }
    }
    // With autograd the packed copy is not used: the same bits and gradients as without it.
    auto xg1 = x.clone().requires_grad_(true), xg2 = x.clone().requires_grad_(true);
    const auto y1 = plain(xg1, pad), y2 = packed(xg2, pad);
    EXPECT_TRUE(torch::equal(y1, y2));
    y1.sum().backward();
    y2.sum().backward();
    EXPECT_TRUE(torch::equal(xg1.grad(), xg2.grad()));
    EXPECT_TRUE(torch::equal(plain->W_query->weight.grad(), packed->W_query->weight.grad()));
  }
  std::ostringstream printed;
  torchattn::MultiHeadAttention m(torchattn::MultiHeadAttentionOptions(8, 8, 4, 2).projections({.pack = {.on = true}}));
  printed << *m;
  EXPECT_NE(printed.str().find("projections=packed float32"), std::string::npos) << printed.str();
}

// The rule "packing on and at least min_rows rows" that the modules, the decoder
// layers and CausalLM share, and the module's policy from its options.
TEST(PackPolicy, TakesRowsFromMinRowsUpOnlyWhenOn) {
  const torchattn::PackPolicy off{.on = false, .min_rows = 1};
  const torchattn::PackPolicy two{.on = true, .min_rows = 2};
  EXPECT_EQ(torchattn::PackPolicy::rows(torch::zeros({3, 4, 8})), 12);
  EXPECT_EQ(torchattn::PackPolicy::rows(torch::zeros({5, 0})), 0);
  EXPECT_FALSE(off.takes(torch::zeros({16, 8})));
  EXPECT_FALSE(two.takes(torch::zeros({1, 8})));
  EXPECT_TRUE(two.takes(torch::zeros({2, 8})));
  EXPECT_TRUE(two.takes(torch::zeros({1, 2, 8})));
  EXPECT_FALSE(two.takes(torch::zeros({1, 1, 8})));
  // The attention's projections take one LinearInference.
  torchattn::MultiHeadAttention m(
      torchattn::MultiHeadAttentionOptions(8, 8, 4, 2).projections({.pack = {.on = true, .min_rows = 3}}));
  EXPECT_TRUE(m->options.projections().pack.on);
  EXPECT_EQ(m->options.projections().pack.min_rows, 3);
  EXPECT_EQ(m->options.projections().format, torchattn::WeightFormat::Float32);
}

}  // namespace

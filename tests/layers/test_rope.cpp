// RoPE (layers/rope.cpp): positions that skip left padding, and the float32 tables of
// functional::rotary_tables.

#include "common/tolerances.h"

#include <torchattn/torchattn.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

using torchattn::RoPEOptions;

namespace {

// Left-padded prompts with RoPE: positions count each sequence's real tokens, so every
// sequence decodes as it would alone (what transformers' generate does).
TEST(ModernAttention, RotaryPositionsSkipLeftPadding) {
  torch::manual_seed(8);
  torchattn::MultiHeadAttention m(
      torchattn::MultiHeadAttentionOptions(8, 8, 16, 4).num_kv_heads(2).rope(RoPEOptions(1e4)).out_bias(false));
  m->eval();
  torch::NoGradGuard no_grad;
  auto alone = torch::randn({1, 6, 8});
  auto padded = torch::cat({torch::randn({1, 3, 8}), alone.narrow(1, 0, 4)}, 1);  // 3 padding tokens
  auto pad = torch::tensor({{true, true, true, false, false, false, false}});
  auto cache = m->make_kv_cache(1);
  auto first = m->forward_cached(padded, cache, pad);
  auto next = m->forward_cached(alone.narrow(1, 4, 2), cache);
  auto expected = m(alone);
  EXPECT_TRUE(tol::close(first.narrow(1, 3, 4), expected.narrow(1, 0, 4)));
  EXPECT_TRUE(tol::close(next, expected.narrow(1, 4, 2)));
  // And a forward with the same mask agrees with the cache.
  EXPECT_TRUE(tol::close(m(padded, pad).narrow(1, 3, 4), expected.narrow(1, 0, 4)));
}

// The tables are built once per device: a second forward does not recompute them,
// and functional::rotary_tables gives transformers' float32 values.
TEST(ModernAttention, RotaryTablesAreFloat32AndReused) {
  const auto [cos, sin] = torchattn::functional::rotary_tables(RoPEOptions(1e4), 8, 5);
  EXPECT_EQ(cos.scalar_type(), torch::kFloat32);
  EXPECT_EQ(cos.sizes(), (std::vector<int64_t>{5, 4}));
  const auto inv = 1.0 / torch::pow(1e4, torch::arange(0, 8, 2, torch::kFloat32) / 8.0);
  EXPECT_TRUE(torch::equal(cos, (torch::arange(5, torch::kFloat32).unsqueeze(1) * inv).cos()));
  EXPECT_TRUE(torch::equal(sin.select(0, 0), torch::zeros({4})));
}

}  // namespace

// The dispatcher (backends/attend.cpp, through functional::attention) on each backend:
// scores of +/-1e4 in half precision stay finite and match float32.

#include "common/tolerances.h"

#include <torchattn/torchattn.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <tuple>

using torchattn::Backend;

namespace {

// ---------------------------------------------------------------------------
// Numerics: scores of +/-1e4 in half precision.
// ---------------------------------------------------------------------------
using NumericsParam = std::tuple<torch::Dtype, Backend>;
class Numerics : public ::testing::TestWithParam<NumericsParam> {};

TEST_P(Numerics, LargeScoresStayFiniteAndMatchFloat32) {
  const auto [dtype, backend] = GetParam();
  namespace F = torchattn::functional;
  // q . k = +/-1e4 for some pairs: exp would overflow any float without max-subtraction.
  auto q = torch::tensor({100.f, 0.f, -100.f, 0.f, 0.f, 100.f, 50.f, 50.f}).view({1, 1, 4, 2});
  auto k = torch::tensor({100.f, 0.f, -100.f, 0.f, 0.f, -100.f, 60.f, 40.f}).view({1, 1, 4, 2});
  auto v = torch::randn({1, 1, 4, 3});
  auto mask = F::causal_mask_buffer(4);
  const F::AttentionOptions cfg{1.0, 0.0, false, backend};
  auto ref = F::attention(q, k, v, mask, 0, cfg);
  auto got = F::attention(q.to(dtype), k.to(dtype), v.to(dtype), mask.to(dtype), 0, cfg);
  ASSERT_TRUE(torch::isfinite(ref).all().item<bool>());
  ASSERT_TRUE(torch::isfinite(got).all().item<bool>()) << got;
  EXPECT_TRUE(tol::close(got, ref, tol::for_dtype(dtype)));
  auto w = F::attention_weights(q.to(dtype), k.to(dtype), mask.to(dtype), 0, 1.0);
  ASSERT_TRUE(torch::isfinite(w).all().item<bool>());
  EXPECT_TRUE(tol::close(w.sum(-1), torch::ones({1, 1, 4}), tol::for_dtype(dtype)));
}

INSTANTIATE_TEST_SUITE_P(Half, Numerics,
                         ::testing::Combine(::testing::Values(torch::kFloat16, torch::kBFloat16, torch::kFloat32),
                                            ::testing::Values(Backend::Reference, Backend::SDPA)));

// resolve_backend: an explicit backend is kept; Auto takes the reference path where
// dropout is in effect (training), SDPA otherwise.
TEST(AttentionOptions, ResolveBackend) {
  const torchattn::functional::AttentionOptions now{.scale = 0.5, .backend = Backend::Reference};
  EXPECT_EQ(torchattn::functional::resolve_backend(now), Backend::Reference);
  EXPECT_EQ(torchattn::functional::resolve_backend({.dropout = 0.1, .training = true}), Backend::Reference);
  EXPECT_EQ(torchattn::functional::resolve_backend({.dropout = 0.1, .training = false}), Backend::SDPA);
}

}  // namespace

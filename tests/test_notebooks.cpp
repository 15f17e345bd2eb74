// The values the notebooks print, from tests/golden/notebooks.txt (tools/make_golden.py
// ran the notebooks' code to make them).

#include "golden.h"
#include "tolerances.h"

#include <torchattn/torchattn.h>

#include <gtest/gtest.h>

namespace F = torchattn::functional;

namespace {

const golden::File& notebooks() {
  static const golden::File file = golden::load("notebooks.txt");
  return file;
}

TEST(Golden, FixturesRecordTheirTorchVersion) {
  EXPECT_FALSE(notebooks().torch_version.empty());
  EXPECT_EQ(notebooks().torch_version.rfind("2.", 0), 0u) << notebooks().torch_version;
}

// 001: torch.manual_seed(789); SelfAttentionV2(d_in, d_out); weights by hand.
TEST(Notebook001, SelfAttentionV2Seed789WeightsAndBothMaskingMethods) {
  const auto& c = notebooks().get("notebook001_self_attention_v2");
  torch::manual_seed(789);
  torchattn::SelfAttentionV2 sa(3, 2);
  const auto inputs = c.tensor("inputs");
  auto queries = sa->W_query(inputs);
  auto keys = sa->W_key(inputs);
  auto scores = queries.matmul(keys.t());
  EXPECT_TRUE(tol::close(scores, c.tensor("attn_scores")));

  auto weights = F::attention_weights(queries, keys, /*causal_mask=*/{}, /*past=*/0, /*scale=*/std::nullopt);
  EXPECT_TRUE(tol::close(weights, c.tensor("attn_weights")));
  // Spot-check against the digits the notebook prints.
  EXPECT_NEAR(weights[0][0].item<double>(), 0.1921, 5e-5);
  EXPECT_NEAR(weights[5][5].item<double>(), 0.1529, 5e-5);

  const int64_t T = 6;
  auto keep = torch::tril(torch::ones({T, T}));
  auto renorm = F::softmax_mask_renormalize(scores / std::sqrt(2.0), keep);
  EXPECT_TRUE(tol::close(renorm, c.tensor("masked_attn_weights_norm")));
  EXPECT_NEAR(renorm[1][0].item<double>(), 0.5517, 5e-5);

  auto inf_method = F::masked_softmax(scores / std::sqrt(2.0), F::causal_mask_buffer(T));
  EXPECT_TRUE(tol::close(inf_method, c.tensor("attn_weights_masked")));
  // The notebook's point: both methods give the same weights.
  EXPECT_TRUE(tol::close(inf_method, renorm));

  EXPECT_TRUE(tol::close(sa(inputs), c.tensor("context")));
}

TEST(Notebook001, CausalWeightsOfTheModuleEqualTheRenormalisedOnes) {
  torch::manual_seed(789);
  torchattn::SelfAttentionV2 sa(3, 2);
  const auto& c = notebooks().get("notebook001_self_attention_v2");
  const auto inputs = c.tensor("inputs");
  auto w = F::attention_weights(sa->W_query(inputs), sa->W_key(inputs), F::causal_mask_buffer(6), 0, std::nullopt);
  EXPECT_TRUE(tol::close(w, c.tensor("masked_attn_weights_norm")));
}

// 003: torch.manual_seed(123); CausalAttention(3, 2, 6, 0.0) on the stacked inputs.
TEST(Notebook003, CausalAttentionSeed123) {
  const auto& c = notebooks().get("notebook003_causal_attention");
  for (auto backend : {torchattn::Backend::Reference, torchattn::Backend::SDPA, torchattn::Backend::Auto}) {
    torch::manual_seed(123);
    torchattn::CausalAttention ca(torchattn::CausalAttentionOptions(3, 2, 6).dropout(0.0).backend(backend));
    auto y = ca(c.tensor("batch"));
    EXPECT_TRUE(tol::close(y, c.tensor("context_vecs"))) << "backend " << backend;
    EXPECT_NEAR(y[0][0][0].item<double>(), -0.4519, 5e-5);
    EXPECT_NEAR(y[1][5][1].item<double>(), -0.1081, 5e-5);
  }
}

// 003: torch.manual_seed(123); MultiHeadAttention(3, 2, 6, 0.0, num_heads=2).
TEST(Notebook003, MultiHeadAttentionSeed123) {
  const auto& c = notebooks().get("notebook003_multi_head_attention");
  for (auto backend : {torchattn::Backend::Reference, torchattn::Backend::SDPA, torchattn::Backend::Auto}) {
    torch::manual_seed(123);
    torchattn::MultiHeadAttention mha(torchattn::MultiHeadAttentionOptions(3, 2, 6, 2).backend(backend));
    EXPECT_TRUE(tol::close(mha(c.tensor("batch")), c.tensor("context_vecs"))) << "backend " << backend;
  }
  torch::manual_seed(123);
  torchattn::MultiHeadAttention python_like(3, 2, 6, /*dropout=*/0.0, /*num_heads=*/2);
  EXPECT_TRUE(tol::close(python_like(c.tensor("batch")), c.tensor("context_vecs")));
}

// 002: both functions on the notebook's q, k, v and mask.
TEST(Notebook002, DotProductAttentionFunctions) {
  const auto& c = notebooks().get("notebook002_dot_product_attention");
  const auto q = c.tensor("q"), k = c.tensor("k"), v = c.tensor("v"), m = c.tensor("m");
  EXPECT_TRUE(tol::close(F::dot_product_attention_weights(q, k, m), c.tensor("weights")));
  EXPECT_TRUE(tol::close(F::dot_product_attention(q, k, v, m), c.tensor("output")));
  EXPECT_TRUE(tol::close(F::dot_product_attention_weights(q, k, torch::tril(torch::ones({2, 2}))),
                         c.tensor("causal_weights")));
  EXPECT_TRUE(tol::close(F::causal_dot_product_attention(q, k, v), c.tensor("causal_output")));
  EXPECT_TRUE(tol::close(F::causal_dot_product_attention(q, k, v, /*scale=*/false), c.tensor("causal_output_unscaled")));
  EXPECT_NEAR(F::causal_dot_product_attention(q, k, v)[1][0].item<double>(), 0.8497, 5e-5);
}

// 004: make_causal_mask and softmax(scores + mask) @ V with batch and heads.
TEST(Notebook004, MakeCausalMaskBroadcastsOverBatchAndHeads) {
  const auto& c = notebooks().get("notebook004_causal_mask");
  auto mask = F::make_causal_mask(4);
  EXPECT_EQ(mask.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(tol::close(mask, c.tensor("causal_mask"), {0.0, 0.0}));
  EXPECT_TRUE(tol::close(F::make_causal_mask(7, -100.0, torch::kFloat64), c.tensor("causal_mask_T7_neg100"), {0.0, 0.0}));

  const auto scores = c.tensor("scores");  // [2, 3, 4, 4] float64
  auto attn = torch::softmax(scores + F::make_causal_mask(4, -1e9, torch::kFloat64), -1);
  EXPECT_TRUE(tol::close(attn, c.tensor("Attn")));
  EXPECT_TRUE(tol::close(attn.matmul(c.tensor("V")), c.tensor("output")));
  // The additive mask and the -inf fill agree.
  EXPECT_TRUE(tol::close(F::masked_softmax(scores, F::causal_mask_buffer(4)), c.tensor("Attn")));
}

} // namespace

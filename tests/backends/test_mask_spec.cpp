// What each query sees (the mask description, backends/mask_spec.cpp), through the
// modules on every backend and device: bool key padding masks and additive key biases,
// left padding, one-row masks over a batch, fully masked rows (zeros, finite
// gradients), and masks through AnyModule.

#include "common/devices.h"
#include "common/tolerances.h"

#include <torchattn/torchattn.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>
#include <tuple>

using torchattn::Backend;

namespace {

// ---------------------------------------------------------------------------
// Masks.
// ---------------------------------------------------------------------------
using MaskParam = std::tuple<Backend, torch::Device>;
class Masks : public ::testing::TestWithParam<MaskParam> {
 protected:
  void SetUp() override { devices::skip_unless_present(std::get<1>(GetParam())); }
  Backend backend() const { return std::get<0>(GetParam()); }
  torch::Device device() const { return std::get<1>(GetParam()); }
};

// Right padding on a non-causal module: the valid rows equal the module run on the
// unpadded sequence. An inverted mask (true = keep) fails this.
TEST_P(Masks, BoolPaddingMaskHidesTrueKeys) {
  torch::manual_seed(21);
  torchattn::SelfAttentionV2 sa(torchattn::SelfAttentionV2Options(6, 4).backend(backend()));
  sa->to(device());
  auto x = torch::randn({1, 7, 6}).to(device());
  auto pad = torch::tensor({{false, false, false, false, true, true, true}}).to(device());
  auto y = sa(x, pad);
  EXPECT_TRUE(tol::close(y.narrow(1, 0, 4), sa(x.narrow(1, 0, 4))));
  // Changing a padded token changes nothing that others see.
  auto x2 = x.clone();
  x2.narrow(1, 5, 1).normal_();
  EXPECT_TRUE(tol::close(sa(x2, pad).narrow(1, 0, 4), y.narrow(1, 0, 4)));
}

// Left padding on a causal module: rows after the padding equal the module on the
// unpadded tail (attention has no positions of its own).
TEST_P(Masks, LeftPaddingOnMultiHeadAttention) {
  torch::manual_seed(22);
  torchattn::MultiHeadAttention mha(torchattn::MultiHeadAttentionOptions(6, 8, 10, 2).backend(backend()));
  mha->to(device());
  auto x = torch::randn({2, 9, 6}).to(device());
  auto pad = torch::zeros({2, 9}, torch::TensorOptions(torch::kBool).device(device()));
  pad.narrow(1, 0, 3).fill_(true);
  auto y = mha(x, pad);
  EXPECT_TRUE(tol::close(y.narrow(1, 3, 6), mha(x.narrow(1, 3, 6))));
}

TEST_P(Masks, KeyBiasIsAdditive) {
  torch::manual_seed(23);
  torchattn::CausalAttention ca(torchattn::CausalAttentionOptions(5, 3, 8).backend(backend()));
  ca->to(device());
  auto x = torch::randn({2, 8, 5}).to(device());
  auto pad = (torch::rand({2, 8}) < 0.4).to(device());
  pad.select(1, 0).fill_(false);
  const float inf = std::numeric_limits<float>::infinity();
  auto additive = torch::zeros({2, 8}, x.options()).masked_fill(pad, -inf);
  EXPECT_TRUE(tol::close(ca->forward(x, {}, additive), ca(x, pad)));
  // A finite bias: softmax(s / sqrt(d) + bias).
  auto bias = torch::randn({2, 8}).to(device());
  auto w = ca->W_query(x).matmul(ca->W_key(x).transpose(1, 2)) / std::sqrt(3.0);
  w = w.masked_fill(torch::triu(torch::ones({8, 8}, pad.options()), 1), -inf) + bias.unsqueeze(1);
  EXPECT_TRUE(tol::close(ca->forward(x, {}, bias), torch::softmax(w, -1).matmul(ca->W_value(x))));
  // Both at once: padding hides, the bias weighs the rest.
  auto both = torch::softmax(w.masked_fill(pad.unsqueeze(1), -inf), -1).matmul(ca->W_value(x));
  EXPECT_TRUE(tol::close(ca->forward(x, pad, bias), both));
}

// [1, T] masks are the same for every sequence of the batch.
TEST_P(Masks, OneRowMasksBroadcastOverTheBatch) {
  torch::manual_seed(25);
  torchattn::MultiHeadAttention mha(torchattn::MultiHeadAttentionOptions(6, 8, 10, 2).backend(backend()));
  mha->to(device());
  auto x = torch::randn({3, 7, 6}).to(device());
  auto pad = torch::tensor({{true, true, false, false, false, true, false}}).to(device());
  auto bias = torch::randn({1, 7}).to(device());
  EXPECT_TRUE(tol::close(mha(x, pad), mha(x, pad.expand({3, 7}).contiguous())));
  EXPECT_TRUE(tol::close(mha->forward(x, {}, bias), mha->forward(x, {}, bias.expand({3, 7}).contiguous())));
  EXPECT_TRUE(tol::close(mha->forward(x, pad, bias),
                         mha->forward(x, pad.expand({3, 7}).contiguous(), bias.expand({3, 7}).contiguous())));
}

// What a query that sees no key outputs: a context row of zeros (so out_proj's bias
// for MultiHeadAttention, zeros for the single-head modules), finite gradients.
TEST_P(Masks, FullyMaskedRowsAreZerosWithFiniteGradients) {
  torch::manual_seed(24);
  torchattn::MultiHeadAttention mha(torchattn::MultiHeadAttentionOptions(4, 4, 6, 2).backend(backend()));
  mha->to(device(), torch::kFloat64);
  auto x = torch::randn({2, 6, 4}, torch::kFloat64).to(device()).requires_grad_(true);
  // Left padding: in batch 0 query 0 sees only key 0, a padding key; in batch 1
  // queries 0-2 see only padding keys.
  auto pad =
      torch::tensor({{true, false, false, false, false, false}, {true, true, true, false, false, false}}).to(device());
  auto y = mha(x, pad);
  ASSERT_FALSE(y.isnan().any().item<bool>());
  // The zero rows come out of attention; out_proj adds its bias.
  auto bias = mha->out_proj->bias.detach();
  EXPECT_TRUE(tol::close(y[0][0], bias));
  EXPECT_TRUE(tol::close(y[1].narrow(0, 0, 3), bias.expand({3, 4})));
  EXPECT_FALSE(tol::close(y[1][3], bias));
  y.sum().backward();
  EXPECT_TRUE(torch::isfinite(x.grad()).all().item<bool>());
  for (auto& p : mha->parameters()) EXPECT_TRUE(torch::isfinite(p.grad()).all().item<bool>());
  // Nothing reaches the padded inputs.
  EXPECT_TRUE(torch::equal(x.grad()[1].narrow(0, 0, 3).cpu(), torch::zeros({3, 4}, torch::kFloat64)));

  // A key_bias of -inf everywhere hides every key too: rows of zeros, never NaN.
  torchattn::CausalAttention ca(torchattn::CausalAttentionOptions(4, 3, 6).backend(backend()));
  ca->to(device());
  auto xs = torch::randn({1, 5, 4}).to(device());
  auto all_hidden = torch::full({1, 5}, -std::numeric_limits<float>::infinity()).to(device());
  EXPECT_TRUE(torch::equal(ca->forward(xs, {}, all_hidden).cpu(), torch::zeros({1, 5, 3})));
}

TEST_P(Masks, WorkThroughAnyModuleAndSequentialWithOneArgument) {
  torchattn::MultiHeadAttention mha(torchattn::MultiHeadAttentionOptions(4, 4, 6, 2).backend(backend()));
  mha->to(device());
  torch::nn::AnyModule any(mha);
  auto x = torch::randn({1, 6, 4}).to(device());
  EXPECT_EQ(any.forward(x).sizes(), x.sizes());
  EXPECT_EQ(any.forward(x, torch::zeros({1, 6}, torch::TensorOptions(torch::kBool).device(device()))).sizes(),
            x.sizes());
}

INSTANTIATE_TEST_SUITE_P(Backends, Masks,
                         ::testing::Combine(::testing::Values(Backend::Reference, Backend::SDPA, Backend::Auto),
                                            ::testing::ValuesIn(devices::all())),
                         [](const ::testing::TestParamInfo<MaskParam>& info) {
                           return devices::prefix(std::get<1>(info.param)) +
                                  std::string(torchattn::to_string(std::get<0>(info.param)));
                         });

}  // namespace

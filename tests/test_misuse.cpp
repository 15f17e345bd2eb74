// Slips that used to give silent wrong results, now right results or errors naming
// the cause and the fix: each sequence's real-token positions after a left-padded
// prefill (KVCache::token_positions), a DecodeGraph step that writes a cache it was
// not given, a Hugging Face attention_mask converted the wrong way, and chunked
// encoding on a non-causal module; reset() on a built module.

#include "devices.h"
#include "expect_error.h"
#include "tolerances.h"

#include <torchattn/torchattn.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <tuple>
#include <vector>

namespace {

using MisuseParam = std::tuple<bool /*static_shapes*/, torch::Device>;

class TokenPositions : public ::testing::TestWithParam<MisuseParam> {
 protected:
  void SetUp() override { devices::skip_unless_present(std::get<1>(GetParam())); }
};

// transformers' position_ids for a padded batch: attention_mask.cumsum(-1) - 1, so the
// next token of each sequence sits at attention_mask.sum(-1).
torch::Tensor next_positions(const torch::Tensor& attention_mask) {
  return attention_mask.sum(-1);
}

// A left-padded batch of prompts of 3, 5 and 1 tokens, then decoding steps: the
// cache's token_positions() counts each sequence's real tokens as transformers'
// position_ids do; position() stays the write index.
TEST_P(TokenPositions, CountRealTokensAfterALeftPaddedPrefill) {
  const auto [static_shapes, device] = GetParam();
  torch::manual_seed(3);
  torchattn::MultiHeadAttention mha(torchattn::MultiHeadAttentionOptions(8, 8, 16, 2));
  mha->to(device);
  mha->eval();
  torch::NoGradGuard no_grad;
  auto attention_mask = torch::tensor({{0, 0, 1, 1, 1}, {1, 1, 1, 1, 1}, {0, 0, 0, 0, 1}}, torch::kLong).to(device);
  auto cache = mha->make_kv_cache(3, static_shapes);
  EXPECT_TRUE(torch::equal(cache.token_positions().cpu(), torch::zeros({3}, torch::kLong)));
  mha->forward_cached(torch::randn({3, 5, 8}).to(device), cache,
                      torchattn::padding_mask_from_attention_mask(attention_mask));
  EXPECT_EQ(cache.token_positions().device(), device);
  EXPECT_TRUE(torch::equal(cache.token_positions().cpu(), next_positions(attention_mask).cpu()));
  EXPECT_EQ(cache.position().item<int64_t>(), 5);
  for (int step = 0; step < 3; ++step) {
    mha->forward_cached(torch::randn({3, 1, 8}).to(device), cache);
    attention_mask = torch::cat({attention_mask, torch::ones({3, 1}, attention_mask.options())}, 1);
    EXPECT_TRUE(torch::equal(cache.token_positions().cpu(), next_positions(attention_mask).cpu())) << "step " << step;
  }
  EXPECT_EQ(cache.position().item<int64_t>(), 8);
  // Unpadded: every sequence's next position is the cache's length.
  cache.reset();
  mha->forward_cached(torch::randn({3, 4, 8}).to(device), cache);
  EXPECT_TRUE(torch::equal(cache.token_positions().cpu(), torch::full({3}, 4, torch::kLong)));
  // A tensor of its own, not a view of the write index.
  cache.token_positions().add_(5);
  EXPECT_EQ(cache.position().item<int64_t>(), 4);
}

INSTANTIATE_TEST_SUITE_P(Caches, TokenPositions, ::testing::Combine(::testing::Bool(), ::testing::ValuesIn(devices::all())),
                         [](const auto& info) {
                           return devices::prefix(std::get<1>(info.param)) +
                                  (std::get<0>(info.param) ? "Static" : "Dynamic");
                         });

// Inside a DecodeGraph step (a CUDA graph on CUDA) token_positions() advances with
// every replay, as position() does.
class TokenPositionsInGraph : public ::testing::TestWithParam<torch::Device> {
 protected:
  void SetUp() override { devices::skip_unless_present(GetParam()); }
};

TEST_P(TokenPositionsInGraph, AdvanceWithEveryStep) {
  const torch::Device device = GetParam();
  torchattn::MultiHeadAttention mha(torchattn::MultiHeadAttentionOptions(8, 8, 16, 2));
  mha->to(device);
  mha->eval();
  torch::NoGradGuard no_grad;
  auto cache = mha->make_kv_cache(2, true);
  const auto pad = torch::tensor({{true, true, false}, {false, false, false}}).to(device);
  mha->forward_cached(torch::randn({2, 3, 8}).to(device), cache, pad);
  torch::Tensor positions;
  torchattn::DecodeGraph step(
      [&](const torch::Tensor& x) {
        positions = cache.token_positions();  // the graph's buffer on CUDA, refreshed by each replay
        return mha->forward_cached(x, cache);
      },
      {&cache});
  for (int64_t t = 0; t < 4; ++t) {
    step(torch::randn({2, 1, 8}).to(device));
    EXPECT_TRUE(torch::equal(positions.cpu(), torch::tensor({1 + t, 3 + t}))) << "step " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, TokenPositionsInGraph, ::testing::ValuesIn(devices::all()),
                         [](const auto& info) { return devices::name(info); });

class UnlistedCache : public ::testing::TestWithParam<torch::Device> {
 protected:
  void SetUp() override { devices::skip_unless_present(GetParam()); }
};

// A step that writes a cache it was not given: an error at the first call, naming the
// rule, and the listed cache is left as it was before the call (CUDA) or advanced
// (CPU, where the step ran eagerly).
TEST_P(UnlistedCache, IsAnErrorAtTheFirstCall) {
  const torch::Device device = GetParam();
  torchattn::MultiHeadAttention a(torchattn::MultiHeadAttentionOptions(8, 8, 16, 2)), b(torchattn::MultiHeadAttentionOptions(8, 8, 16, 2));
  a->to(device);
  b->to(device);
  a->eval();
  b->eval();
  torch::NoGradGuard no_grad;
  auto cache_a = a->make_kv_cache(1, true), cache_b = b->make_kv_cache(1, true);
  a->forward_cached(torch::randn({1, 2, 8}).to(device), cache_a);
  b->forward_cached(torch::randn({1, 2, 8}).to(device), cache_b);
  torchattn::DecodeGraph step([&](const torch::Tensor& x) { return b->forward_cached(a->forward_cached(x, cache_a), cache_b); },
                              {&cache_a});
  expect_error([&] { step(torch::randn({1, 1, 8}).to(device)); },
               "DecodeGraph: the step wrote a KV cache (static shapes, 3 tokens) that is not among the 1 caches it "
               "was given; list every cache the step writes");
  // Listing both works.
  cache_a.truncate(2);
  cache_b.truncate(2);
  torchattn::DecodeGraph good([&](const torch::Tensor& x) { return b->forward_cached(a->forward_cached(x, cache_a), cache_b); },
                              {&cache_a, &cache_b});
  good(torch::randn({1, 1, 8}).to(device));
  good(torch::randn({1, 1, 8}).to(device));
  EXPECT_EQ(cache_a.length(), 4);
  EXPECT_EQ(cache_b.length(), 4);
}

INSTANTIATE_TEST_SUITE_P(Devices, UnlistedCache, ::testing::ValuesIn(devices::all()),
                         [](const auto& info) { return devices::name(info); });

// Hugging Face's attention_mask (1 = token) becomes torchattn's key_padding_mask
// (true = ignore) by padding_mask_from_attention_mask, and the module then gives each
// sequence's rows as it gives them alone; the slip (.to(kBool)) is far off, and an
// integer mask passed as it is names the conversion.
TEST(HuggingFaceMask, ConvertsToThePaddingMaskAndTheSlipIsNamed) {
  torch::manual_seed(5);
  torchattn::MultiHeadAttention mha(torchattn::MultiHeadAttentionOptions(8, 8, 16, 2).causal(false));
  mha->eval();
  torch::NoGradGuard no_grad;
  const auto attention_mask = torch::tensor({{1, 1, 1, 0, 0}, {1, 1, 1, 1, 0}}, torch::kLong);
  const auto pad = torchattn::padding_mask_from_attention_mask(attention_mask);
  EXPECT_EQ(pad.scalar_type(), torch::kBool);
  EXPECT_TRUE(torch::equal(pad, attention_mask == 0));
  const auto x = torch::randn({2, 5, 8});
  const auto y = mha(x, pad);
  for (int64_t b = 0; b < 2; ++b) {
    const int64_t n = attention_mask[b].sum().item<int64_t>();
    EXPECT_TRUE(tol::close(y[b].narrow(0, 0, n), mha(x[b].narrow(0, 0, n).unsqueeze(0))[0])) << "sequence " << b;
  }
  // Every sequence is padded, so the slip passes the all-hidden check and is silently wrong.
  const auto slip = mha(x, attention_mask.to(torch::kBool));
  EXPECT_GT((slip - y).abs().max().item<double>(), 0.1);
  expect_error([&] { mha(x, attention_mask); }, "pass attention_mask == 0, or "
                                                "torchattn::padding_mask_from_attention_mask(attention_mask)");
  expect_error([&] { torchattn::padding_mask_from_attention_mask(torch::tensor({1, 2, 0})); },
               "padding_mask_from_attention_mask: expected an attention_mask of 0s and 1s, got other values");
  expect_error([&] { torchattn::padding_mask_from_attention_mask(torch::ones({2, 3})); },
               "padding_mask_from_attention_mask: expected an integer or bool attention_mask (1 = token, 0 = padding), "
               "got Float");
  expect_error([&] { torchattn::padding_mask_from_attention_mask(torch::ones({1, 2, 3}, torch::kLong)); },
               "padding_mask_from_attention_mask: expected attention_mask of shape [B, T] or [T], got [1, 2, 3]");
}

// Chunked encoding on a non-causal module cannot give the full forward's rows: an
// error that says to call forward() on the whole sequence, on both modules.
TEST(Encoder, ForwardCachedIsAnError) {
  torch::NoGradGuard no_grad;
  torchattn::MultiHeadAttention mha(torchattn::MultiHeadAttentionOptions(8, 8, 16, 2).causal(false));
  auto cache = mha->make_kv_cache(1);
  expect_error([&] { mha->forward_cached(torch::randn({1, 3, 8}), cache); },
               "MultiHeadAttention: forward_cached needs a causal module, this one has causal(false): each token "
               "attends to later tokens too, so a sequence encoded in chunks cannot give the full forward's rows; "
               "call forward() on the whole sequence");
  torchattn::CausalAttention ca(torchattn::CausalAttentionOptions(8, 8, 16).causal(false));
  auto cache2 = ca->make_kv_cache(1);
  expect_error([&] { ca->forward_cached(torch::randn({1, 3, 8}), cache2); },
               "CausalAttention: forward_cached needs a causal module, this one has causal(false)");
}

// reset() on a built module registered its layers a second time (LibTorch's "Submodule
// 'W_query' already defined"): now an error saying what reset() is for. clone(), which
// calls reset() on an emptied copy, still works and copies the weights.
template <typename Module>
void expect_reset_refused_and_clone_kept(Module m, const std::string& name) {
  const std::string message = error_of([&] { m->reset(); });
  EXPECT_HAS(message, name + "::reset: expected a module without its layers (reset() builds them once: the "
                      "constructor and clone() call it), got a built one; for new random weights construct another " +
                      name + " from its options, for a copy call clone()");
  auto copy = std::dynamic_pointer_cast<typename Module::ContainedType>(m->clone());
  ASSERT_NE(copy, nullptr);
  EXPECT_TRUE(torch::equal(copy->W_query->weight, m->W_query->weight));
  EXPECT_NE(copy->W_query->weight.data_ptr(), m->W_query->weight.data_ptr());
  EXPECT_EQ(copy->named_parameters().size(), m->named_parameters().size());
}

TEST(Reset, OnABuiltModuleIsAnErrorAndCloneStillWorks) {
  expect_reset_refused_and_clone_kept(torchattn::MultiHeadAttention(8, 8, 16, 0.0, 2), "MultiHeadAttention");
  expect_reset_refused_and_clone_kept(torchattn::CausalAttention(8, 8, 16, 0.0), "CausalAttention");
  expect_reset_refused_and_clone_kept(torchattn::SelfAttentionV2(8, 8), "SelfAttentionV2");
}

} // namespace

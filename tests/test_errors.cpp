// Bad input: each is a c10::Error whose message names the argument, what was
// expected and what came.

#include <torchattn/torchattn.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <string>

namespace F = torchattn::functional;

namespace {

struct ErrorCase {
  std::string name;
  std::function<void()> call;
  std::string message;  // must appear in what_without_backtrace()
};

class BadInput : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(BadInput, IsACheckedErrorNamingTheArgument) {
  const auto& c = GetParam();
  try {
    c.call();
    FAIL() << c.name << ": expected a c10::Error";
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    EXPECT_NE(what.find(c.message), std::string::npos) << "message was: " << what;
  }
}

torch::Tensor x3(int64_t B, int64_t T, int64_t d) { return torch::randn({B, T, d}); }

std::vector<ErrorCase> error_cases() {
  using torchattn::CausalAttention;
  using torchattn::CausalAttentionOptions;
  using torchattn::MultiHeadAttention;
  using torchattn::MultiHeadAttentionOptions;
  using torchattn::SelfAttentionV2;
  return {
      {"TooManyTokens", [] { CausalAttention(3, 2, 6, 0.0)(x3(1, 7, 3)); },
       "CausalAttention: expected at most context_length=6 tokens, got 7"},
      {"TooManyTokensMHA", [] { MultiHeadAttention(3, 2, 6, 0.0, 2)(x3(1, 9, 3)); },
       "MultiHeadAttention: expected at most context_length=6 tokens, got 9"},
      {"HeadsDoNotDivide", [] { MultiHeadAttention(3, 5, 6, 0.0, 2); },
       "MultiHeadAttention: expected d_out divisible by num_heads, got d_out=5 and num_heads=2"},
      {"WrongFeatures", [] { MultiHeadAttention(3, 2, 6, 0.0, 2)(x3(2, 4, 4)); },
       "MultiHeadAttention: expected input with d_in=3 features, got 4"},
      {"WrongFeaturesSA", [] { SelfAttentionV2(3, 2)(torch::randn({6, 5})); },
       "SelfAttentionV2: expected input with d_in=3 features, got 5"},
      {"Rank1", [] { CausalAttention(3, 2, 6, 0.0)(torch::randn({3})); },
       "CausalAttention: expected input of rank 2 [T, d_in] or 3 [B, T, d_in], got rank 1"},
      {"Rank4", [] { MultiHeadAttention(3, 2, 6, 0.0, 2)(torch::randn({1, 2, 6, 3})); },
       "expected input of rank 2 [T, d_in] or 3 [B, T, d_in], got rank 4"},
      {"IntegerInput", [] { CausalAttention(3, 2, 6, 0.0)(torch::ones({2, 6, 3}, torch::kLong)); },
       "CausalAttention: expected a floating-point input (float, double, bfloat16 or half), got Long"},
      {"DtypeMismatch", [] { CausalAttention(3, 2, 6, 0.0)(torch::ones({2, 6, 3}, torch::kDouble)); },
       "CausalAttention: expected input of the module's dtype Float, got Double"},
      {"DropoutOne", [] { CausalAttention(3, 2, 6, 1.0); }, "CausalAttention: expected dropout in [0, 1), got 1"},
      {"DropoutNegative", [] { MultiHeadAttention(3, 2, 6, -0.1, 2); },
       "MultiHeadAttention: expected dropout in [0, 1), got -0.1"},
      {"ZeroDIn", [] { SelfAttentionV2(0, 2); }, "SelfAttentionV2: expected d_in > 0, got 0"},
      {"ZeroDOut", [] { CausalAttention(3, 0, 6, 0.0); }, "CausalAttention: expected d_out > 0, got 0"},
      {"NegativeContext", [] { CausalAttention(3, 2, -1, 0.0); },
       "CausalAttention: expected context_length > 0, got -1"},
      {"ZeroHeads", [] { MultiHeadAttention(3, 2, 6, 0.0, 0); }, "MultiHeadAttention: expected num_heads > 0, got 0"},
      {"NanScale", [] { CausalAttention(CausalAttentionOptions(3, 2, 6).scale(std::nan(""))); },
       "CausalAttention: expected a positive, finite scale"},
      {"ZeroScale", [] { MultiHeadAttention(MultiHeadAttentionOptions(3, 2, 6, 2).scale(0.0)); },
       "MultiHeadAttention: expected a positive, finite scale, got 0"},
      {"ZeroTokens", [] { CausalAttention(3, 2, 6, 0.0)(x3(1, 0, 3)); },
       "CausalAttention: expected at least one token"},
      {"MaskDoesNotBroadcast",
       [] { F::dot_product_attention(torch::randn({2, 3}), torch::randn({4, 3}), torch::randn({4, 3}), torch::ones({3, 4})); },
       "dot_product_attention: expected mask broadcastable to [2, 4], got [3, 4]"},
      {"MaskTooManyDims",
       [] { F::dot_product_attention(torch::randn({2, 3}), torch::randn({4, 3}), torch::randn({4, 3}), torch::ones({1, 2, 4})); },
       "dot_product_attention: expected mask broadcastable to [2, 4], got [1, 2, 4]"},
      {"QKFeatures", [] { F::dot_product_attention(torch::randn({2, 3}), torch::randn({4, 5}), torch::randn({4, 5})); },
       "dot_product_attention: expected q and k with the same feature size d"},
      {"VTokens", [] { F::dot_product_attention(torch::randn({2, 3}), torch::randn({4, 3}), torch::randn({5, 3})); },
       "dot_product_attention: expected v with as many tokens as k"},
      {"IntegerQ", [] { F::dot_product_attention(torch::ones({2, 3}, torch::kInt), torch::randn({4, 3}), torch::randn({4, 3})); },
       "dot_product_attention: expected a floating-point q"},
      {"CausalNotSquare",
       [] { F::causal_dot_product_attention(torch::randn({2, 3}), torch::randn({4, 3}), torch::randn({4, 3})); },
       "causal_dot_product_attention: expected k with Tq=2 tokens"},
      {"MakeMaskSize", [] { F::make_causal_mask(0); }, "make_causal_mask: expected T > 0, got 0"},
      {"MaskedSoftmax", [] { F::masked_softmax(torch::randn({3, 4}), torch::ones({4, 4})); },
       "masked_softmax: expected hide broadcastable to [3, 4], got [4, 4]"},
      {"CachePastContext",
       [] {
         torch::NoGradGuard g;
         MultiHeadAttention m(3, 2, 6, 0.0, 2);
         auto cache = m->make_kv_cache(1);
         m->forward_cached(x3(1, 4, 3), cache);
         m->forward_cached(x3(1, 3, 3), cache);
       },
       "MultiHeadAttention: the KV cache holds 4 tokens; 3 more would pass context_length=6"},
      {"CacheBatch",
       [] {
         MultiHeadAttention m(3, 2, 6, 0.0, 2);
         auto cache = m->make_kv_cache(2);
         m->forward_cached(x3(3, 1, 3), cache);
       },
       "MultiHeadAttention: expected input with the cache's batch_size=2, got 3"},
      {"CacheFromAnotherModule",
       [] {
         MultiHeadAttention m(3, 2, 6, 0.0, 2);
         CausalAttention other(3, 2, 8, 0.0);
         auto cache = other->make_kv_cache(1);
         m->forward_cached(x3(1, 1, 3), cache);
       },
       "MultiHeadAttention: expected a cache of context_length=6, got one of 8"},
      {"EmptyCache",
       [] {
         CausalAttention m(3, 2, 6, 0.0);
         torchattn::KVCache cache;
         m->forward_cached(x3(1, 1, 3), cache);
       },
       "CausalAttention: expected a cache from make_kv_cache(batch_size), got an empty KVCache"},
      {"PaddingMaskShape", [] { MultiHeadAttention(3, 2, 6, 0.0, 2)(x3(2, 5, 3), torch::zeros({2, 4}, torch::kBool)); },
       "MultiHeadAttention: expected key_padding_mask of shape [2, 5] (input without its feature dimension), got [2, 4]"},
      {"PaddingMaskDtype", [] { CausalAttention(3, 2, 6, 0.0)(x3(2, 5, 3), torch::zeros({2, 5}, torch::kLong)); },
       "CausalAttention: expected key_padding_mask of dtype Bool (true = ignore the key) or Float (added to the scores), got Long"},
      {"PaddingMaskUnbatched", [] { SelfAttentionV2(3, 2)(torch::randn({5, 3}), torch::zeros({1, 5}, torch::kBool)); },
       "SelfAttentionV2: expected key_padding_mask of shape [5]"},
      {"CacheInGradMode",
       [] {
         CausalAttention m(3, 2, 6, 0.0);
         auto cache = m->make_kv_cache(1);
         m->forward_cached(x3(1, 2, 3), cache);
       },
       "CausalAttention: forward_cached is for inference: call it under torch::NoGradGuard"},
      {"PaddingMaskNeedsBatch",
       [] {
         F::attention(torch::randn({4, 3}), torch::randn({5, 3}), torch::randn({5, 3}), {}, 0, {},
                      torch::zeros({4, 5}, torch::kBool));
       },
       "attention: a key_padding_mask needs batched q [B, ..., Tq, d], got q [4, 3]"},
      {"CacheBatchSizeZero", [] { CausalAttention(3, 2, 6, 0.0)->make_kv_cache(0); },
       "CausalAttention: expected batch_size > 0, got 0"},
  };
}

INSTANTIATE_TEST_SUITE_P(Checks, BadInput, ::testing::ValuesIn(error_cases()),
                         [](const ::testing::TestParamInfo<ErrorCase>& info) { return info.param.name; });

} // namespace

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
       "MultiHeadAttention: expected d_out divisible by num_heads (or head_dim set), got d_out=5 and num_heads=2"},
      {"AlibiNotCausal", [] { MultiHeadAttention(MultiHeadAttentionOptions(4, 4, 6, 2).alibi(true).causal(false)); },
       "MultiHeadAttention: alibi needs causal(true) (its distances are to earlier keys), got causal(false)"},
      {"AlibiAndRope",
       [] { MultiHeadAttention(MultiHeadAttentionOptions(4, 4, 6, 2).alibi(true).rope(torchattn::RoPEOptions())); },
       "MultiHeadAttention: alibi and rope both give positions; choose one, got both"},
      {"WeightFormatOutsideTheEnum",
       [] {
         MultiHeadAttention(MultiHeadAttentionOptions(4, 4, 6, 2)
                                .projections({.pack = {}, .format = static_cast<torchattn::WeightFormat>(9)}));
       },
       "MultiHeadAttention: projections.format: expected WeightFormat::Float32, BFloat16, Int8, DynamicInt8 or Int4, got the "
       "value 9 (an integer cast to WeightFormat?)"},
      {"KdimZero", [] { MultiHeadAttention(MultiHeadAttentionOptions(4, 4, 6, 2).kdim(0)); },
       "MultiHeadAttention: expected kdim > 0, got 0"},
      {"SelfAttentionWithKdim", [] { MultiHeadAttention(MultiHeadAttentionOptions(4, 4, 6, 2).kdim(6))(x3(1, 3, 4)); },
       "MultiHeadAttention: forward reads keys and values from x, so it needs kdim and vdim equal to d_in=4, got kdim=6 "
       "and vdim=4; attend over a context with forward_cross"},
      {"CrossOnCausal",
       [] { MultiHeadAttention(MultiHeadAttentionOptions(4, 4, 6, 2))->forward_cross(x3(1, 3, 4), x3(1, 5, 4)); },
       "MultiHeadAttention: cross_kv attends over the whole context, so it needs causal(false), got causal(true)"},
      {"CrossWithRope",
       [] {
         MultiHeadAttention(MultiHeadAttentionOptions(4, 4, 6, 2).causal(false).rope(torchattn::RoPEOptions()))
             ->forward_cross(x3(1, 3, 4), x3(1, 5, 4));
       },
       "MultiHeadAttention: cross_kv gives the context no positions, so it is not available with rope"},
      {"CrossContextWidth",
       [] { MultiHeadAttention(MultiHeadAttentionOptions(4, 4, 6, 2).causal(false).kdim(6))->cross_kv(x3(1, 5, 4)); },
       "MultiHeadAttention: cross_kv expected context with kdim=6 features and at least one token, got [1, 5, 4]"},
      {"CrossValueWidth",
       [] { MultiHeadAttention(MultiHeadAttentionOptions(4, 4, 6, 2).causal(false).vdim(3))->cross_kv(x3(1, 5, 4)); },
       "MultiHeadAttention: cross_kv needs a value_context [..., S, vdim=3] when vdim differs from kdim=4"},
      {"CrossPaddingAll",
       [] {
         MultiHeadAttention(MultiHeadAttentionOptions(4, 4, 6, 2).causal(false))
             ->cross_kv(x3(1, 5, 4), torch::ones({1, 5}, torch::kBool));
       },
       "MultiHeadAttention: key_padding_mask ignores every key of sequence 0"},
      {"CrossPaddingShape",
       [] {
         MultiHeadAttention(MultiHeadAttentionOptions(4, 4, 6, 2).causal(false))
             ->cross_kv(x3(2, 5, 4), torch::zeros({2, 4}, torch::kBool));
       },
       "MultiHeadAttention: expected context_padding_mask of shape [B, T] = [2, 5] (or [1, 5]), got [2, 4]"},
      {"CrossBatch",
       [] {
         MultiHeadAttention m(MultiHeadAttentionOptions(4, 4, 6, 2).causal(false));
         m->forward_cross(x3(3, 2, 4), m->cross_kv(x3(2, 5, 4)));
       },
       "MultiHeadAttention: forward_cross expected x of the CrossKV's batch_size=2, got 3"},
      {"SoftcapZero", [] { MultiHeadAttention(MultiHeadAttentionOptions(4, 4, 6, 2).softcap(0.0)); },
       "MultiHeadAttention: expected softcap > 0, got 0"},
      {"HeadDimZero", [] { MultiHeadAttention(MultiHeadAttentionOptions(3, 5, 6, 2).head_dim(0)); },
       "MultiHeadAttention: expected head_dim > 0, got 0"},
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
       [] {
         F::dot_product_attention(torch::randn({2, 3}), torch::randn({4, 3}), torch::randn({4, 3}),
                                  torch::ones({3, 4}));
       },
       "dot_product_attention: expected mask broadcastable to [2, 4], got [3, 4]"},
      {"MaskTooManyDims",
       [] {
         F::dot_product_attention(torch::randn({2, 3}), torch::randn({4, 3}), torch::randn({4, 3}),
                                  torch::ones({1, 2, 4}));
       },
       "dot_product_attention: expected mask broadcastable to [2, 4], got [1, 2, 4]"},
      {"QKFeatures", [] { F::dot_product_attention(torch::randn({2, 3}), torch::randn({4, 5}), torch::randn({4, 5})); },
       "dot_product_attention: expected q and k with the same feature size d"},
      {"VTokens", [] { F::dot_product_attention(torch::randn({2, 3}), torch::randn({4, 3}), torch::randn({5, 3})); },
       "dot_product_attention: expected v with as many tokens as k"},
      {"IntegerQ",
       [] { F::dot_product_attention(torch::ones({2, 3}, torch::kInt), torch::randn({4, 3}), torch::randn({4, 3})); },
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
       "MultiHeadAttention: the KV cache holds 4 tokens; 3 more would pass its capacity of 6 (call cache.reset()"},
      {"CacheCapacityPastTheContext", [] { MultiHeadAttention(3, 2, 6, 0.0, 2)->make_kv_cache(1, false, 7); },
       "MultiHeadAttention: make_kv_cache expected a capacity in [1, context_length=6] (or 0 for context_length), got "
       "7"},
      {"CacheCapacityNegative", [] { CausalAttention(3, 2, 6, 0.0)->make_kv_cache(1, false, -1); },
       "CausalAttention: make_kv_cache expected a capacity in [1, context_length=6] (or 0 for context_length), got -1"},
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
       "MultiHeadAttention: this KV cache was made by another module"},
      {"CacheFromAnotherLayerOfTheSameShape",
       [] {
         torch::NoGradGuard g;
         MultiHeadAttention layer0(3, 2, 6, 0.0, 2), layer1(3, 2, 6, 0.0, 2);
         auto cache = layer0->make_kv_cache(1);
         layer1->forward_cached(x3(1, 1, 3), cache);
       },
       "MultiHeadAttention: this KV cache was made by another module (each attention layer needs its own cache"},
      {"CacheOfACloneIsAnotherModules",
       [] {
         torch::NoGradGuard g;
         CausalAttention m(3, 2, 6, 0.0);
         auto copy = std::dynamic_pointer_cast<torchattn::CausalAttentionImpl>(m->clone());
         auto cache = m->make_kv_cache(1);
         copy->forward_cached(x3(1, 1, 3), cache);
       },
       "CausalAttention: this KV cache was made by another module"},
      {"CacheMadeDirectlyHasAnotherContext",
       [] {
         torch::NoGradGuard g;
         MultiHeadAttention m(3, 2, 6, 0.0, 2);
         torchattn::KVCache cache({1, 2, 8, 1}, torch::kFloat);
         m->forward_cached(x3(1, 1, 3), cache);
       },
       "MultiHeadAttention: expected a cache of at most context_length=6 tokens, got one of 8"},
      {"InferenceCacheOutsideInferenceMode",
       [] {
         MultiHeadAttention m(3, 2, 6, 0.0, 2);
         auto cache = [&] {
           c10::InferenceMode guard;
           return m->make_kv_cache(1);
         }();
         torch::NoGradGuard g;
         m->forward_cached(x3(1, 1, 3), cache);
       },
       "MultiHeadAttention: this KV cache was made under c10::InferenceMode, so it holds inference tensors"},
      {"CacheInTrainingModeWithDropout",
       [] {
         torch::NoGradGuard g;
         MultiHeadAttention m(3, 2, 6, 0.1, 2);
         auto cache = m->make_kv_cache(1);
         m->forward_cached(x3(1, 1, 3), cache);
       },
       "MultiHeadAttention: forward_cached in training mode would apply dropout=0.1 to the attention weights; call "
       "module->eval()"},
      {"CachePaddingMaskShape",
       [] {
         torch::NoGradGuard g;
         MultiHeadAttention m(3, 2, 6, 0.0, 2);
         auto cache = m->make_kv_cache(2);
         m->forward_cached(x3(2, 3, 3), cache, torch::zeros({2, 2}, torch::kBool));
       },
       "MultiHeadAttention: expected key_padding_mask of shape [B, T] = [2, 3] (or [1, 3]), got [2, 2]"},
      {"CachePaddingMaskFloat",
       [] {
         torch::NoGradGuard g;
         CausalAttention m(3, 2, 6, 0.0);
         auto cache = m->make_kv_cache(1);
         m->forward_cached(x3(1, 3, 3), cache, torch::ones({1, 3}));
       },
       "CausalAttention: expected a bool key_padding_mask (true = ignore that key"},
      {"PaddingMaskShape", [] { MultiHeadAttention(3, 2, 6, 0.0, 2)(x3(2, 5, 3), torch::zeros({2, 4}, torch::kBool)); },
       "MultiHeadAttention: expected key_padding_mask of shape [B, T] = [2, 5] (or [1, 5]), got [2, 4]"},
      {"PaddingMaskDtype", [] { CausalAttention(3, 2, 6, 0.0)(x3(2, 5, 3), torch::zeros({2, 5}, torch::kLong)); },
       "CausalAttention: expected a bool key_padding_mask (true = ignore that key, as in torch.nn.MultiheadAttention), "
       "got Long; a Hugging Face attention_mask (1 = token, 0 = padding) means the opposite: pass attention_mask == 0, "
       "or torchattn::padding_mask_from_attention_mask(attention_mask), not attention_mask.to(torch::kBool)"},
      // A float keep-mask (1 = keep, as functional::dot_product_attention takes) is not silently added.
      {"FloatKeepMaskAsPaddingMask", [] { MultiHeadAttention(3, 2, 6, 0.0, 2)(x3(2, 5, 3), torch::ones({2, 5})); },
       "MultiHeadAttention: expected a bool key_padding_mask (true = ignore that key, as in torch.nn.MultiheadAttention), "
       "got Float; an additive mask (0 keeps, -inf hides) goes in key_bias"},
      // at::scaled_dot_product_attention's bool convention (true = attend) hides everything.
      {"SdpaConventionPaddingMask",
       [] { MultiHeadAttention(3, 2, 6, 0.0, 2)(x3(2, 5, 3), torch::ones({2, 5}, torch::kBool)); },
       "MultiHeadAttention: key_padding_mask ignores every key of sequence 0; true marks a padding key to ignore (as "
       "in torch.nn.MultiheadAttention), the opposite of at::scaled_dot_product_attention's attn_mask (true = "
       "attend): pass mask.logical_not(); a Hugging Face attention_mask (1 = token) converts with attention_mask == 0, "
       "not .to(torch::kBool)"},
      {"SdpaConventionPaddingMaskSA", [] { SelfAttentionV2(3, 2)(x3(1, 4, 3), torch::ones({1, 4}, torch::kBool)); },
       "SelfAttentionV2: key_padding_mask ignores every key of sequence 0"},
      {"PaddingMaskUnbatched", [] { SelfAttentionV2(3, 2)(torch::randn({5, 3}), torch::zeros({1, 5}, torch::kBool)); },
       "SelfAttentionV2: expected key_padding_mask of shape [T] = [5], got [1, 5]"},
      {"PaddingMaskDevice",
       [] {
         CausalAttention(3, 2, 6, 0.0)(x3(1, 5, 3),
                                       torch::zeros({1, 5}, torch::TensorOptions(torch::kBool).device(torch::kMeta)));
       },
       "CausalAttention: expected key_padding_mask on cpu, got meta"},
      {"KeyBiasBool",
       [] { CausalAttention(3, 2, 6, 0.0)->forward(x3(2, 5, 3), {}, torch::zeros({2, 5}, torch::kBool)); },
       "CausalAttention: expected key_bias of the input's dtype Float (added to the scores: 0 keeps, -inf hides), got "
       "Bool; a bool mask of keys to ignore is key_padding_mask"},
      {"KeyBiasDtype",
       [] { MultiHeadAttention(3, 2, 6, 0.0, 2)->forward(x3(2, 5, 3), {}, torch::zeros({2, 5}, torch::kDouble)); },
       "MultiHeadAttention: expected key_bias of the input's dtype Float"},
      {"KeyBiasShape", [] { SelfAttentionV2(3, 2)->forward(x3(2, 5, 3), {}, torch::zeros({3, 5})); },
       "SelfAttentionV2: expected key_bias of shape [B, T] = [2, 5] (or [1, 5]), got [3, 5]"},
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
       "attention: a key_padding_mask or key_bias needs batched q [B, ..., Tq, d], got q [4, 3]"},
      {"FunctionalFloatPaddingMask",
       [] {
         F::attention(torch::randn({1, 4, 3}), torch::randn({1, 4, 3}), torch::randn({1, 4, 3}), {}, 0, {},
                      torch::zeros({1, 4}));
       },
       "attention: expected a bool key_padding_mask (true = ignore the key), got Float; pass an additive mask (0 "
       "keeps, -inf hides) as key_bias"},
      {"FunctionalKeyBiasShape",
       [] {
         F::attention(torch::randn({2, 4, 3}), torch::randn({2, 4, 3}), torch::randn({2, 4, 3}), {}, 0, {}, {},
                      torch::zeros({2, 5}));
       },
       "attention: expected key_bias of shape [B, Tk] = [2, 4] (or [1, 4]), got [2, 5]"},
      {"RotaryPositionsPastTheTables",
       [] {
         const auto [c, s] = F::rotary_tables(torchattn::RoPEOptions(), 8, 4);
         F::apply_rotary(torch::zeros({1, 2, 8}), torch::tensor({1, 7}), c, s, torchattn::RoPEOptions());
       },
       "apply_rotary: expected positions in [0, 4) (the cos and sin tables' length), got positions from 1 to 7; make "
       "the tables longer: rotary_tables(options, head_dim, length)"},
      {"CacheBatchSizeZero", [] { CausalAttention(3, 2, 6, 0.0)->make_kv_cache(0); },
       "CausalAttention: expected batch_size > 0, got 0"},
  };
}

INSTANTIATE_TEST_SUITE_P(Checks, BadInput, ::testing::ValuesIn(error_cases()),
                         [](const ::testing::TestParamInfo<ErrorCase>& info) { return info.param.name; });

}  // namespace

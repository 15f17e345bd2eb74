// MultiHeadAttention (and functional::attention) with a flex_attention variant
// (MultiHeadAttentionOptions::flex, torchattn::flex_variant): a variant written as the
// module's own masks and scores gives the module's numbers without it, in forward
// (outputs and every parameter's gradient), forward_cached (prefill then one token at a
// time: q_idx is each query's position) and forward_packed; in float32 and float64,
// grouped heads included. The module's window, softcap and ALiBi composed with a
// variant of the user's own. Then what a variant does not take: each a clear error
// naming the option.

#include "common/expect_error.h"

#include <torchattn/flex_attention.h>
#include <torchattn/flex/variants.h>
#include <torchattn/functional.h>
#include <torchattn/multi_head_attention.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace {

struct Window4 {  // MultiHeadAttentionOptions::window(4): i - 4 < j <= i
  bool operator()(int64_t, int64_t, int64_t q, int64_t kv) const { return q >= kv && q - kv < 4; }
};

struct Softcap30 {
  template <class T>
  T operator()(T s, int64_t, int64_t, int64_t, int64_t) const {
    return 30.0 * tanh(s / 30.0);
  }
};

torchattn::MultiHeadAttentionOptions options(bool grouped) {
  auto o = torchattn::MultiHeadAttentionOptions(32, 32, 64, 4);
  if (grouped) o.num_kv_heads(2);
  return o;
}

// Two modules of the same weights: `plain` with the library's own masks and scores, and
// `flex` with the variant.
struct Pair {
  torchattn::MultiHeadAttention plain{nullptr}, flex{nullptr};
};

Pair pair(const torchattn::MultiHeadAttentionOptions& plain_options, const torchattn::FlexVariant& variant,
          torch::Dtype dtype) {
  torch::manual_seed(4);
  Pair p{torchattn::MultiHeadAttention(plain_options),
         torchattn::MultiHeadAttention(torchattn::MultiHeadAttentionOptions(plain_options)
                                           .window(std::nullopt)
                                           .softcap(std::nullopt)
                                           .flex(variant))};
  p.plain->to(dtype);
  p.flex->to(dtype);
  torch::NoGradGuard no_grad;
  const auto from = p.plain->named_parameters();
  for (auto& item : p.flex->named_parameters()) item.value().copy_(from[item.key()]);
  return p;
}

double tolerance(torch::Dtype dtype) { return dtype == torch::kFloat64 ? 1e-12 : 2e-6; }

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(1.0, b.abs().max().item<double>());
}

struct ModuleCase {
  std::string name;
  bool grouped;
  torch::Dtype dtype;
};

std::ostream& operator<<(std::ostream& os, const ModuleCase& c) { return os << c.name; }

class FlexModules : public ::testing::TestWithParam<ModuleCase> {};

// forward: outputs and every parameter's gradient, causal (the module's own mask with
// a variant that hides nothing), a window and a softcap written as mods.
TEST_P(FlexModules, ForwardAndGradientsEqualTheModulesOwnMasks) {
  const ModuleCase& c = GetParam();
  const auto x = torch::randn({2, 37, 32}, torch::TensorOptions().dtype(c.dtype));
  const auto dout = torch::randn({2, 37, 32}, torch::TensorOptions().dtype(c.dtype));
  std::vector<std::pair<std::string, Pair>> pairs = {
      {"causal", pair(options(c.grouped), torchattn::flex_variant(torchattn::IdentityScore{}, torchattn::VisibleKeys{}),
                      c.dtype)},
      {"window",
       pair(options(c.grouped).window(4), torchattn::flex_variant(torchattn::IdentityScore{}, Window4{}), c.dtype)},
      {"softcap",
       pair(options(c.grouped).softcap(30.0), torchattn::flex_variant(Softcap30{}, torchattn::VisibleKeys{}), c.dtype)},
  };
  for (auto& [name, p] : pairs) {
    const auto want = p.plain->forward(x), got = p.flex->forward(x);
    EXPECT_LE(max_diff(got, want), tolerance(c.dtype)) << name;
    want.backward(dout);
    got.backward(dout);
    const auto plain_params = p.plain->named_parameters();
    for (const auto& item : p.flex->named_parameters()) {
      EXPECT_LE(max_diff(item.value().grad(), plain_params[item.key()].grad()), tolerance(c.dtype))
          << name << " " << item.key();
    }
  }
}

// forward_cached: a prefill of 5 tokens, then one token at a time; the variant sees
// each query's position (the window hides by position), equal to the module's window.
TEST_P(FlexModules, DecodingPassesEachQuerysPosition) {
  const ModuleCase& c = GetParam();
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({2, 12, 32}, torch::TensorOptions().dtype(c.dtype));
  Pair p = pair(options(c.grouped).window(4), torchattn::flex_variant(torchattn::IdentityScore{}, Window4{}), c.dtype);
  const auto full = p.plain->forward(x);
  auto cache = p.flex->make_kv_cache(2);
  std::vector<torch::Tensor> parts{p.flex->forward_cached(x.narrow(1, 0, 5), cache)};
  for (int64_t t = 5; t < 12; ++t) parts.push_back(p.flex->forward_cached(x.narrow(1, t, 1), cache));
  EXPECT_LE(max_diff(torch::cat(parts, 1), full), tolerance(c.dtype));
  // A score_mod that reads q_idx: the positions of decoding are those of the whole.
  const auto distance = [](auto s, int64_t, int64_t, int64_t q, int64_t kv) {
    return s - 0.25 * static_cast<double>(q - kv);
  };
  Pair d = pair(options(c.grouped), torchattn::flex_variant(distance, torchattn::VisibleKeys{}), c.dtype);
  const auto whole = d.flex->forward(x);
  auto cache2 = d.flex->make_kv_cache(2);
  std::vector<torch::Tensor> steps{d.flex->forward_cached(x.narrow(1, 0, 5), cache2)};
  for (int64_t t = 5; t < 12; ++t) steps.push_back(d.flex->forward_cached(x.narrow(1, t, 1), cache2));
  EXPECT_LE(max_diff(torch::cat(steps, 1), whole), tolerance(c.dtype));
  EXPECT_GT(max_diff(whole, d.plain->forward(x)), 1e-3);  // the bias changed the numbers
}

// The module's window, softcap and ALiBi with a variant of the user's own (a score_mod
// that reads positions, a mask_mod that hides key 2): equal to the variant alone with
// them written into its mods, in forward (every gradient) and decoding.
struct Tilt {
  template <class T>
  T operator()(T s, int64_t, int64_t, int64_t q, int64_t kv) const {
    return s - 0.25 * static_cast<double>(q - kv);
  }
};
struct HideKey2 {
  bool operator()(int64_t, int64_t, int64_t, int64_t kv) const { return kv != 2; }
};

TEST_P(FlexModules, TheModulesWindowSoftcapAndAlibiComposeWithAVariant) {
  const ModuleCase& c = GetParam();
  const auto x = torch::randn({2, 13, 32}, torch::TensorOptions().dtype(c.dtype));
  const auto dout = torch::randn({2, 13, 32}, torch::TensorOptions().dtype(c.dtype));
  const auto own = torchattn::flex_variant(Tilt{}, HideKey2{});
  const auto window_written = [](int64_t, int64_t, int64_t q, int64_t kv) { return kv != 2 && q - kv < 4; };
  const auto softcap_written = [](auto s, int64_t b, int64_t h, int64_t q, int64_t kv) {
    using std::tanh;
    return Tilt{}(3.0 * tanh(s / 3.0), b, h, q, kv);
  };
  const torchattn::flex::Alibi slopes(4);  // the module's: BLOOM's for 4 heads
  const auto alibi_written = [slopes](auto s, int64_t b, int64_t h, int64_t q, int64_t kv) {
    return Tilt{}(slopes(s, b, h, q, kv), b, h, q, kv);
  };
  struct Composed {
    std::string name;
    torchattn::MultiHeadAttentionOptions with_module_variant, written;
  };
  const std::vector<Composed> cases = {
      {"window", options(c.grouped).window(4).flex(own),
       options(c.grouped).flex(torchattn::flex_variant(Tilt{}, window_written))},
      {"softcap", options(c.grouped).softcap(3.0).flex(own),
       options(c.grouped).flex(torchattn::flex_variant(softcap_written, HideKey2{}))},
      {"alibi", options(c.grouped).alibi(true).flex(own),
       options(c.grouped).flex(torchattn::flex_variant(alibi_written, HideKey2{}))},
  };
  for (const auto& composed : cases) {
    SCOPED_TRACE(composed.name);
    torch::manual_seed(4);
    torchattn::MultiHeadAttention got_module(composed.with_module_variant), want_module(composed.written),
        variant_alone(options(c.grouped).flex(own));
    got_module->to(c.dtype);
    want_module->to(c.dtype);
    variant_alone->to(c.dtype);
    {
      torch::NoGradGuard no_grad;
      const auto from = got_module->named_parameters();
      for (auto& item : want_module->named_parameters()) item.value().copy_(from[item.key()]);
      for (auto& item : variant_alone->named_parameters()) item.value().copy_(from[item.key()]);
    }
    const auto got = got_module->forward(x), want = want_module->forward(x);
    EXPECT_LE(max_diff(got, want), tolerance(c.dtype));
    EXPECT_GT(max_diff(got, variant_alone->forward(x)), 1e-3);  // the module's option did something
    got.backward(dout);
    want.backward(dout);
    const auto want_params = want_module->named_parameters();
    for (const auto& item : got_module->named_parameters()) {
      EXPECT_LE(max_diff(item.value().grad(), want_params[item.key()].grad()), tolerance(c.dtype)) << item.key();
    }
    // Decoding: a prefill of 5 tokens, then one at a time, each at its position.
    torch::NoGradGuard no_grad;
    auto cache = got_module->make_kv_cache(2);
    std::vector<torch::Tensor> parts{got_module->forward_cached(x.narrow(1, 0, 5), cache)};
    for (int64_t t = 5; t < 13; ++t) parts.push_back(got_module->forward_cached(x.narrow(1, t, 1), cache));
    EXPECT_LE(max_diff(torch::cat(parts, 1), want.detach()), tolerance(c.dtype));
  }
}

// forward_packed: each document alone, from position 0.
TEST_P(FlexModules, PackedDocumentsEachFromPositionZero) {
  const ModuleCase& c = GetParam();
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({30, 32}, torch::TensorOptions().dtype(c.dtype));
  Pair p = pair(options(c.grouped).window(4), torchattn::flex_variant(torchattn::IdentityScore{}, Window4{}), c.dtype);
  const auto cu_seqlens = torch::tensor({0, 11, 30}, torch::kInt64);
  EXPECT_LE(max_diff(p.flex->forward_packed(x, cu_seqlens), p.plain->forward_packed(x, cu_seqlens)),
            tolerance(c.dtype));
}

INSTANTIATE_TEST_SUITE_P(Modules, FlexModules,
                         ::testing::Values(ModuleCase{"f64", false, torch::kFloat64},
                                           ModuleCase{"f64_grouped", true, torch::kFloat64},
                                           ModuleCase{"f32_grouped", true, torch::kFloat32}),
                         [](const ::testing::TestParamInfo<ModuleCase>& info) { return info.param.name; });

// functional::attention takes the variant in AttentionOptions: a prefix-LM mask (keys
// before 6 seen by every query) on a non-causal call equals the same mask as a bool mask.
TEST(FlexFunctional, AttentionOptionsTakeAVariant) {
  torch::manual_seed(2);
  const auto q = torch::randn({1, 2, 20, 8}, torch::kFloat64), k = torch::randn({1, 2, 20, 8}, torch::kFloat64),
             v = torch::randn({1, 2, 20, 8}, torch::kFloat64);
  const auto prefix = [](int64_t, int64_t, int64_t i, int64_t j) { return j < 6 || j <= i; };
  torchattn::functional::AttentionOptions config;
  config.flex = torchattn::flex_variant(torchattn::IdentityScore{}, prefix);
  const auto got = torchattn::functional::attention(q, k, v, /*causal_mask=*/at::Tensor(), /*past=*/0, config);
  const auto visible = (torch::arange(20).unsqueeze(1) >= torch::arange(20).unsqueeze(0)) | (torch::arange(20) < 6);
  const auto want = at::scaled_dot_product_attention(q, k, v, visible);
  EXPECT_LE(max_diff(got, want), 1e-12);
}

TEST(FlexModules, WhatAVariantDoesNotTakeIsAClearError) {
  const auto variant = torchattn::flex_variant(torchattn::IdentityScore{}, torchattn::VisibleKeys{});
  const auto x = torch::randn({1, 6, 32});
  const std::string fn = "attention with a flex variant (AttentionOptions::flex): ";
  torchattn::MultiHeadAttention alibi(options(false).alibi(true).flex(variant));
  expect_error([&] { alibi->forward_packed(x[0], torch::tensor({0, 2, 6}, torch::kInt64)); },
               fn + "expected no score bias (ALiBi in forward_packed: write it as a score_mod)");
  torchattn::MultiHeadAttention m(options(false).flex(variant));
  expect_error([&] { m->forward(x, torch::zeros({1, 6}, torch::kBool)); },
               fn + "expected no key padding mask or key bias (write them into mask_mod or score_mod)");
  auto static_cache = m->make_kv_cache(1, /*static_shapes=*/true);
  expect_error(
      [&] {
        torch::NoGradGuard no_grad;
        m->forward_cached(x, static_cache);
      },
      fn + "expected a dynamic-shape KV cache (make_kv_cache(batch, /*static_shapes=*/false))");
  torchattn::MultiHeadAttention dropped(options(false).dropout(0.1).flex(variant));
  dropped->train();
  expect_error([&] { dropped->forward(x); }, fn + "expected no dropout in training, got dropout 0.1");
  dropped->eval();
  EXPECT_EQ(dropped->forward(x).sizes(), x.sizes());
}

}  // namespace

// The named variants on the flex kernels (src/backends/named_flex.cpp): attend() on the
// CPU, in float32 and float64, past a decoding step's rows, with a softcap, ALiBi's
// slopes or a window takes flex's kernels with Softcap's or Alibi's score_mod, the same
// bits as flex_attention called with them here (outputs with and without grad mode,
// and the gradients of q, k and v), whatever its mask: none, causal after a cache's
// keys, a sliding window; and the dedicated paths' numbers within rounding. Where they
// do not apply (a decoding step's rows, bfloat16, a backend named, sinks, a key padding
// mask, a softcap with ALiBi, dropout in training) attend() keeps the dedicated paths,
// bit for bit.

#include "backends/alibi.h"
#include "backends/attend.h"
#include "backends/blocked.h"
#include "backends/mask_spec.h"

#include <torchattn/flex/variants.h>
#include <torchattn/flex_attention.h>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

// A named namespace: this file shares a unity-build unit with other flex tests.
namespace named_flex_test {

namespace flex = torchattn::flex;
using torchattn::backends::MaskSpec;
using torchattn::functional::AttentionOptions;
using Attention = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&)>;

struct Case {
  const char* name;
  int64_t B, H, Hkv, Tq, Tk, D;
  bool causal;
  std::optional<int64_t> window;
  int64_t past() const { return Tk - Tq; }
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

const std::vector<Case> kCases = {
    {"encoder_T200", 2, 4, 4, 200, 200, 16, false, std::nullopt},
    {"causal_T300_grouped", 1, 6, 3, 300, 300, 16, true, std::nullopt},
    {"causal_chunk_after_cache", 1, 4, 2, 60, 300, 16, true, std::nullopt},
    {"window37_T257", 1, 4, 2, 257, 257, 32, true, 37},
    {"window64_chunk_after_cache", 2, 4, 1, 40, 170, 8, true, 64},
    {"decoding_step_16_rows", 1, 4, 2, 16, 90, 16, true, std::nullopt},
    {"decoding_step_window8", 2, 6, 2, 1, 300, 16, true, 8},
    {"cross_attention_step", 1, 4, 4, 1, 70, 16, false, std::nullopt},
};

MaskSpec spec_of(const Case& c) {
  MaskSpec spec;
  spec.causal = c.causal;
  spec.past = c.causal ? c.past() : 0;
  spec.window = c.window;
  return spec;
}

// The variant of a call: a softcap, ALiBi (BLOOM's slopes) or neither (a window alone).
struct Variant {
  const char* name;
  std::optional<double> softcap;
  bool alibi = false;
};

const std::vector<Variant> kVariants = {{"softcap 1.5", 1.5},
                                        {"softcap 30", 30.0},
                                        {"alibi", std::nullopt, true},
                                        {"none", std::nullopt}};

// flex_attention with the variant's score_mod and the case's mask, called here.
template <class ScoreMod>
torch::Tensor flex_with_mask(const Case& c, const ScoreMod& mod, const torchattn::FlexOptions& options,
                             const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  if (!c.causal) return torchattn::flex_attention(q, k, v, mod, options).output;
  if (c.window) {
    const auto mask = torchattn::create_block_mask(flex::SlidingWindow(*c.window, c.past()), 1, 1, c.Tq, c.Tk);
    return torchattn::flex_attention(q, k, v, mod, mask, options).output;
  }
  const auto mask = torchattn::create_block_mask(flex::Causal(c.past()), 1, 1, c.Tq, c.Tk);
  return torchattn::flex_attention(q, k, v, mod, mask, options).output;
}

Attention flex_of(const Case& c, const Variant& variant) {
  return [=](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
    const auto options = torchattn::FlexOptions().with_scale(1.0 / std::sqrt(static_cast<double>(c.D)));
    if (variant.softcap) return flex_with_mask(c, flex::Softcap(*variant.softcap), options, q, k, v);
    if (variant.alibi) return flex_with_mask(c, flex::Alibi(c.H, c.Tk - c.Tq), options, q, k, v);
    return flex_with_mask(c, torchattn::IdentityScore{}, options, q, k, v);
  };
}

// Outputs without and with grad mode, and the gradients of q, k and v for dout.
std::vector<torch::Tensor> results(const Attention& fn, const std::vector<torch::Tensor>& qkv,
                                   const torch::Tensor& dout) {
  std::vector<torch::Tensor> out;
  {
    torch::NoGradGuard no_grad;
    out.push_back(fn(qkv[0], qkv[1], qkv[2]));
  }
  auto q = qkv[0].clone().requires_grad_(), k = qkv[1].clone().requires_grad_(), v = qkv[2].clone().requires_grad_();
  auto y = fn(q, k, v);
  y.backward(dout);
  for (const auto& t : {y.detach(), q.grad(), k.grad(), v.grad()}) out.push_back(t);
  return out;
}

std::vector<torch::Tensor> draw(const Case& c, torch::Dtype dtype, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto o = torch::TensorOptions().dtype(dtype);
  return {at::randn({c.B, c.H, c.Tq, c.D}, gen, o), at::randn({c.B, c.Hkv, c.Tk, c.D}, gen, o),
          at::randn({c.B, c.Hkv, c.Tk, c.D}, gen, o), at::randn({c.B, c.H, c.Tq, c.D}, gen, o)};
}

void expect_bits(const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& want) {
  const char* names[] = {"output without grad", "output", "dq", "dk", "dv"};
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(torch::equal(got[i], want[i])) << names[i];
}

class NamedFlex : public ::testing::TestWithParam<Case> {};

TEST_P(NamedFlex, VariantsTakeFlexsKernelsBitForBit) {
  const Case c = GetParam();
  for (const torch::Dtype dtype : {torch::kFloat32, torch::kFloat64}) {
    for (const Variant& variant : kVariants) {
      if ((variant.alibi && !c.causal) || (!variant.softcap && !variant.alibi && !c.window)) continue;
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " " + variant.name);
      const auto qkv = draw(c, dtype, 11);
      const AttentionOptions config{.softcap = variant.softcap};
      MaskSpec spec = spec_of(c);
      if (variant.alibi) spec.alibi_slopes = torchattn::backends::alibi_slopes(c.H);
      const auto ours =
          results([&](const torch::Tensor& q, const torch::Tensor& k,
                      const torch::Tensor& v) { return torchattn::backends::attend(q, k, v, spec, config); },
                  qkv, qkv[3]);
      expect_bits(ours, results(flex_of(c, variant), qkv, qkv[3]));
      // And the dedicated path's numbers (the Reference backend's: the notebooks' math,
      // blocks of queries with a softcap), within rounding of sums in another order.
      AttentionOptions reference = config;
      reference.backend = torchattn::Backend::Reference;
      const auto dedicated =
          results([&](const torch::Tensor& q, const torch::Tensor& k,
                      const torch::Tensor& v) { return torchattn::backends::attend(q, k, v, spec, reference); },
                  qkv, qkv[3]);
      const double tol = dtype == torch::kFloat32 ? 2e-5 : 1e-12;
      const char* names[] = {"output without grad", "output", "dq", "dk", "dv"};
      for (size_t i = 0; i < ours.size(); ++i) {
        EXPECT_TRUE(torch::allclose(ours[i], dedicated[i], tol, tol))
            << names[i] << ": " << (ours[i] - dedicated[i]).abs().max().item<double>();
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, NamedFlex, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// Where the named instances do not apply, attend() gives the blocked path's bits.
TEST(NamedFlexOutside, TheBlockedPathKeepsTheRest) {
  const Case c{"causal_T40", 1, 4, 2, 40, 40, 16, true, std::nullopt};
  const MaskSpec spec = spec_of(c);
  const auto same = [&](const std::vector<torch::Tensor>& qkv, const MaskSpec& s, const AttentionOptions& config,
                        const char* what) {
    SCOPED_TRACE(what);
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(torch::equal(torchattn::backends::attend(qkv[0], qkv[1], qkv[2], s, config),
                             torchattn::backends::blocked_attention(qkv[0], qkv[1], qkv[2], s, config)));
  };
  const auto f32 = draw(c, torch::kFloat32, 12);
  same(f32, spec, {.backend = torchattn::Backend::Reference, .softcap = 30.0}, "the Reference backend");
  same(f32, spec, {.backend = torchattn::Backend::SDPA, .softcap = 30.0}, "the SDPA backend");
  same(f32, spec, {.softcap = 30.0, .sinks = torch::randn({c.H})}, "sinks");
  MaskSpec padded = spec;
  padded.key_padding = torch::zeros({1, c.Tk}, torch::kBool);
  padded.key_padding.index_put_({0, 3}, true);
  same(f32, padded, {.softcap = 30.0}, "a key padding mask");
  same(draw(c, torch::kBFloat16, 13), spec, {.softcap = 30.0}, "bfloat16");
  // Dropout in training: the blocked path's draws, the same from the same seed.
  torch::manual_seed(3);
  const auto a = torchattn::backends::attend(f32[0], f32[1], f32[2], spec,
                                             {.dropout = 0.3, .training = true, .softcap = 30.0});
  torch::manual_seed(3);
  const auto b = torchattn::backends::blocked_attention(f32[0], f32[1], f32[2], spec,
                                                        {.dropout = 0.3, .training = true, .softcap = 30.0});
  EXPECT_TRUE(torch::equal(a, b));
}

// ALiBi where the named instances do not apply: attend() adds alibi_bias's scores, as
// a spec with that score bias gives them, bit for bit.
TEST(NamedFlexOutside, AlibiElsewhereIsItsScoreBias) {
  const auto as_bias = [](const std::vector<torch::Tensor>& qkv, MaskSpec spec, const AttentionOptions& config,
                          const char* what) {
    SCOPED_TRACE(what);
    torch::NoGradGuard no_grad;
    const int64_t Tq = qkv[0].size(2), Tk = qkv[1].size(2);
    MaskSpec biased = spec;
    biased.score_bias = torchattn::backends::alibi_bias(torchattn::backends::alibi_slopes(qkv[0].size(1)),
                                                        spec.key_padding, Tq, Tk, qkv[0].scalar_type());
    spec.alibi_slopes = torchattn::backends::alibi_slopes(qkv[0].size(1));
    EXPECT_TRUE(torch::equal(torchattn::backends::attend(qkv[0], qkv[1], qkv[2], spec, config),
                             torchattn::backends::attend(qkv[0], qkv[1], qkv[2], biased, config)));
  };
  const Case c{"causal_T40", 1, 4, 2, 40, 60, 16, true, std::nullopt};
  const auto f32 = draw(c, torch::kFloat32, 15);
  as_bias(f32, spec_of(c), {.softcap = 30.0}, "with a softcap");
  MaskSpec padded = spec_of(c);
  padded.key_padding = torch::zeros({1, c.Tk}, torch::kBool);
  padded.key_padding.index_put_({0, 0}, true);
  as_bias(f32, padded, {}, "with a key padding mask (positions count the real tokens)");
  as_bias(draw(c, torch::kBFloat16, 16), spec_of(c), {}, "bfloat16");
}

}  // namespace named_flex_test

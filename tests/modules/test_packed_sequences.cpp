// MultiHeadAttention::forward_packed: documents packed end to end against each document
// run alone through forward, outputs and gradients (the input's and every weight's), over
// the module's options (causal or not, RoPE, ALiBi, window, grouped heads, QK-norm,
// softcap, sinks, no mask buffer) and backends, random document lengths with 1 and
// context_length among them, float64 within 1e-10 and float32 within 1e-5; dropout
// masks as the documents run alone in order; and the errors of bad cu_seqlens.

#include "common/devices.h"
#include "common/expect_error.h"
#include "common/tolerances.h"

#include <torchattn/torchattn.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace {

using torchattn::Backend;
using torchattn::MultiHeadAttentionOptions;

constexpr int64_t kPackedContext = 24;

struct PackedVariant {
  std::string name;
  MultiHeadAttentionOptions options;
};

std::vector<PackedVariant> packed_variants() {
  const auto base = MultiHeadAttentionOptions(16, 16, kPackedContext, 4).qkv_bias(true);
  return {
      {"causal", base},
      {"not_causal", MultiHeadAttentionOptions(base).causal(false)},
      {"rope", MultiHeadAttentionOptions(base).rope(torchattn::RoPEOptions())},
      {"alibi", MultiHeadAttentionOptions(base).alibi(true)},
      {"window", MultiHeadAttentionOptions(base).window(5)},
      {"gqa_rope", MultiHeadAttentionOptions(base).num_kv_heads(2).rope(torchattn::RoPEOptions())},
      {"qk_norm", MultiHeadAttentionOptions(base).qk_norm(torchattn::QKNormOptions())},
      {"softcap_sinks", MultiHeadAttentionOptions(base).softcap(20.0).sinks(true)},
      {"no_mask_buffer", MultiHeadAttentionOptions(base).mask_buffer(false)},
  };
}

using PackedParam = std::tuple<int /*variant*/, Backend, torch::Dtype, torch::Device>;

class PackedSequences : public ::testing::TestWithParam<PackedParam> {
 protected:
  void SetUp() override { devices::skip_unless_present(std::get<3>(GetParam())); }
};

// Lengths summing to a packed batch: 1 and context_length among random ones, and
// lengths that repeat.
std::vector<int64_t> document_lengths(int64_t seed) {
  torch::manual_seed(seed);
  std::vector<int64_t> lens{1, kPackedContext};
  for (int i = 0; i < 4; ++i) lens.push_back(torch::randint(1, kPackedContext + 1, {1}).item<int64_t>());
  std::swap(lens[1], lens[3]);  // the longest not last
  // Repeated lengths, apart.
  lens.push_back(lens[2]);
  lens.push_back(1);
  return lens;
}

TEST_P(PackedSequences, EqualEachDocumentAlone) {
  const auto [variant, backend, dtype, device] = GetParam();
  const PackedVariant v = packed_variants()[static_cast<size_t>(variant)];
  torch::manual_seed(21);
  torchattn::MultiHeadAttention mha(MultiHeadAttentionOptions(v.options).backend(backend));
  mha->to(device, dtype);
  const auto lens = document_lengths(22 + variant);
  std::vector<int64_t> cu{0};
  for (int64_t L : lens) cu.push_back(cu.back() + L);
  const int64_t N = cu.back();
  torch::manual_seed(23);
  const auto x0 = torch::randn({N, 16}).to(device, dtype);
  const auto g = torch::randn({N, 16}).to(device, dtype);
  const auto t = tol::for_dtype(dtype);

  auto grads = [&]() {
    std::vector<torch::Tensor> out;
    for (auto& p : mha->parameters()) {
      out.push_back(p.grad().clone());
      p.mutable_grad() = torch::Tensor();
    }
    return out;
  };
  // Packed, with cu_seqlens as int32 on x's device (FlashAttention's form).
  auto xp = x0.clone().requires_grad_(true);
  const auto cu_seqlens = torch::tensor(cu, torch::kLong).to(device, torch::kInt);
  const auto yp = mha->forward_packed(xp, cu_seqlens);
  ASSERT_EQ(yp.sizes(), x0.sizes());
  (yp * g).sum().backward();
  const auto dxp = xp.grad();
  const auto dwp = grads();

  // Each document alone, [1, L, d].
  auto xs = x0.clone().requires_grad_(true);
  std::vector<torch::Tensor> ys;
  for (size_t s = 0; s < lens.size(); ++s) {
    ys.push_back(mha(xs.narrow(0, cu[s], lens[s]).unsqueeze(0)).squeeze(0));
  }
  const auto ya = torch::cat(ys, 0);
  (ya * g).sum().backward();
  const auto dwa = grads();

  EXPECT_TRUE(tol::close(yp, ya, t)) << v.name << " output";
  EXPECT_TRUE(tol::close(dxp, xs.grad(), t)) << v.name << " input gradient";
  ASSERT_EQ(dwp.size(), dwa.size());
  for (size_t i = 0; i < dwp.size(); ++i) EXPECT_TRUE(tol::close(dwp[i], dwa[i], t)) << v.name << " weight " << i;
}

std::string packed_name(const ::testing::TestParamInfo<PackedParam>& info) {
  const auto [variant, backend, dtype, device] = info.param;
  return packed_variants()[static_cast<size_t>(variant)].name + "_" + std::string(torchattn::to_string(backend)) +
         (dtype == torch::kFloat64 ? "_f64_" : "_f32_") +
         devices::name(::testing::TestParamInfo<torch::Device>(device, 0));
}

INSTANTIATE_TEST_SUITE_P(Packed, PackedSequences,
                         ::testing::Combine(::testing::Range(0, static_cast<int>(packed_variants().size())),
                                            ::testing::Values(Backend::Auto, Backend::Reference, Backend::SDPA),
                                            ::testing::Values(torch::kFloat64, torch::kFloat32),
                                            ::testing::ValuesIn(devices::all())),
                         packed_name);

// CausalAttention (single head): causal or not, a window, RoPE; every backend.
TEST(PackedSequencesCausalAttention, EqualEachDocumentAlone) {
  using torchattn::CausalAttentionOptions;
  const auto base = CausalAttentionOptions(8, 6, kPackedContext).qkv_bias(true);
  const std::vector<std::pair<std::string, CausalAttentionOptions>> variants = {
      {"causal", base},
      {"not_causal", CausalAttentionOptions(base).causal(false)},
      {"window", CausalAttentionOptions(base).window(4)},
      {"rope", CausalAttentionOptions(base).rope(torchattn::RoPEOptions())},
  };
  const std::vector<int64_t> cu{0, 1, 9, 9 + kPackedContext, 9 + kPackedContext + 5};
  for (const auto& [name, options] : variants) {
    for (const Backend backend : {Backend::Auto, Backend::Reference, Backend::SDPA}) {
      torch::manual_seed(41);
      torchattn::CausalAttention ca(CausalAttentionOptions(options).backend(backend));
      ca->to(torch::kFloat64);
      const auto x0 = torch::randn({cu.back(), 8}, torch::kFloat64);
      auto xp = x0.clone().requires_grad_(true);
      const auto yp = ca->forward_packed(xp, torch::tensor(cu));
      yp.pow(2).sum().backward();
      auto xs = x0.clone().requires_grad_(true);
      std::vector<torch::Tensor> ys;
      for (size_t s = 0; s + 1 < cu.size(); ++s) ys.push_back(ca(xs.narrow(0, cu[s], cu[s + 1] - cu[s])));
      const auto ya = torch::cat(ys, 0);
      ya.pow(2).sum().backward();
      const auto t = tol::for_dtype(torch::kFloat64);
      EXPECT_TRUE(tol::close(yp, ya, t)) << name << " " << backend;
      EXPECT_TRUE(tol::close(xp.grad(), xs.grad(), t)) << name << " " << backend;
    }
  }
  torchattn::CausalAttention ca(base);
  expect_error([&] { ca->forward_packed(torch::randn({4, 8}), torch::tensor({0, 2, 5})); },
               "CausalAttention.forward_packed: expected cu_seqlens to end at x's 4 rows, got 5");
}

// Dropout: the masks of forward on each document alone, one after another, from the
// same generator.
TEST(PackedSequencesDropout, MasksOfTheDocumentsAloneInOrder) {
  torch::manual_seed(31);
  torchattn::MultiHeadAttention mha(MultiHeadAttentionOptions(16, 16, kPackedContext, 4).dropout(0.3));
  mha->to(torch::kFloat64);
  mha->train();
  const std::vector<int64_t> lens{7, 1, 12, 5};
  const auto x = torch::randn({25, 16}, torch::kFloat64);
  torch::manual_seed(32);
  const auto yp = mha->forward_packed(x, torch::tensor({0, 7, 8, 20, 25}, torch::kLong));
  torch::manual_seed(32);
  std::vector<torch::Tensor> ys;
  int64_t start = 0;
  for (int64_t L : lens) {
    ys.push_back(mha(x.narrow(0, start, L).unsqueeze(0)).squeeze(0));
    start += L;
  }
  EXPECT_TRUE(tol::close(yp, torch::cat(ys, 0), tol::for_dtype(torch::kFloat64)));
  torch::manual_seed(33);
  EXPECT_FALSE(torch::allclose(mha->forward_packed(x, torch::tensor({0, 7, 8, 20, 25})), yp));
}

TEST(PackedSequencesErrors, BadCuSeqlensAreNamed) {
  torchattn::MultiHeadAttention mha(MultiHeadAttentionOptions(16, 16, kPackedContext, 4));
  const auto x = torch::randn({10, 16});
  const std::string fn = "MultiHeadAttention.forward_packed: ";
  expect_error([&] { mha->forward_packed(x, torch::tensor({1, 10})); },
               fn + "expected cu_seqlens to start at 0, got 1");
  expect_error([&] { mha->forward_packed(x, torch::tensor({0, 4, 9})); },
               fn + "expected cu_seqlens to end at x's 10 rows, got 9");
  expect_error([&] { mha->forward_packed(x, torch::tensor({0, 6, 4, 10})); },
               fn + "expected cu_seqlens increasing (every document at least one token), got 6 then 4 at document 1");
  expect_error([&] { mha->forward_packed(x, torch::tensor({0, 4, 4, 10})); }, "got 4 then 4 at document 1");
  expect_error([&] { mha->forward_packed(x, torch::tensor({0.0, 10.0})); },
               fn + "expected cu_seqlens int32 or int64, got Float");
  expect_error([&] { mha->forward_packed(x, torch::tensor({0})); },
               fn + "expected cu_seqlens of shape [S + 1] with S >= 1 documents, got [1]");
  expect_error([&] { mha->forward_packed(x, torch::Tensor()); }, fn + "expected cu_seqlens, got an undefined tensor");
  const auto long_x = torch::randn({30, 16});
  expect_error([&] { mha->forward_packed(long_x, torch::tensor({0, 3, 30})); },
               fn + "expected documents of at most context_length=24 tokens, got 27 in document 1");
  expect_error([&] { mha->forward_packed(torch::randn({2, 5, 16}), torch::tensor({0, 5})); },
               "MultiHeadAttention.forward_packed: expected x of shape [N, d_in], got [2, 5, 16]");
  if (torch::cuda::is_available()) {
    const auto xc = x.to(torch::kCUDA);
    mha->to(torch::kCUDA);
    EXPECT_NO_THROW(mha->forward_packed(xc, torch::tensor({0, 10})));
  }
}

// functional::attention_packed, the core alone: each document as functional::attention
// on it alone (the notebooks' buffer for causal), outputs and the gradients of q, k and
// v, on each backend, float64, 1 and long documents among random lengths; its errors.
TEST(PackedSequencesFunctional, AttentionPackedEqualsEachDocumentAlone) {
  torch::manual_seed(81);
  const std::vector<int64_t> lens{1, 17, 3, 17, 30, 8, 1, 17};
  std::vector<int64_t> cu{0};
  for (const int64_t L : lens) cu.push_back(cu.back() + L);
  const int64_t N = cu.back();
  for (const Backend backend : {Backend::Auto, Backend::Reference, Backend::SDPA}) {
    for (const bool causal : {true, false}) {
      SCOPED_TRACE(std::string(causal ? "causal" : "not causal") + ", backend " +
                   std::to_string(static_cast<int>(backend)));
      const torchattn::functional::AttentionOptions config{.backend = backend};
      const auto opts = torch::TensorOptions().dtype(torch::kDouble).requires_grad(true);
      const auto q = torch::randn({2, 3, N, 8}, opts), k = torch::randn({2, 3, N, 8}, opts);
      const auto v = torch::randn({2, 3, N, 5}, opts);
      const auto got = torchattn::functional::attention_packed(q, k, v, torch::tensor(cu), causal, config);
      std::vector<torch::Tensor> parts;
      for (size_t s = 0; s < lens.size(); ++s) {
        const auto mask = causal ? torchattn::functional::causal_mask_buffer(lens[s], torch::kDouble) : torch::Tensor();
        parts.push_back(torchattn::functional::attention(q.narrow(-2, cu[s], lens[s]), k.narrow(-2, cu[s], lens[s]),
                                                         v.narrow(-2, cu[s], lens[s]), mask, 0, config));
      }
      const auto want = torch::cat(parts, -2);
      EXPECT_TRUE(tol::close(got, want, {1e-10, 1e-10}));
      const auto w = torch::randn_like(want);
      const auto g_got = torch::autograd::grad({(got * w).sum()}, {q, k, v});
      const auto g_want = torch::autograd::grad({(want * w).sum()}, {q, k, v});
      for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(tol::close(g_got[i], g_want[i], {1e-10, 1e-10})) << "gradient " << i;
    }
  }
  const auto q = torch::randn({2, 10, 4});
  expect_error([&] { torchattn::functional::attention_packed(q, q, q, torch::tensor({0, 4, 9}), true); },
               "attention_packed: expected cu_seqlens to end at q's 10 tokens (dim -2), got 9");
  expect_error(
      [&] { torchattn::functional::attention_packed(q, q.narrow(1, 0, 9), q, torch::tensor({0, 10}), true); },
      "attention_packed: expected q, k and v with the same N tokens along dim -2, got q [2, 10, 4], k [2, 9, 4]");
}

}  // namespace

// Static-shape KV caches and DecodeGraph: on every device the replayed (CUDA) or
// eager (CPU) decoding steps give the rows of the full forward, positions live on
// the device (token_positions too), and misuse is a clear error: a step that writes a
// cache it was not given among them.

#include "common/devices.h"
#include "common/expect_error.h"
#include "common/tolerances.h"

#include <torchattn/torchattn.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <tuple>
#include <vector>

namespace {

using torchattn::Backend;

using DecodeParam = std::tuple<Backend, torch::Dtype, bool /*mask_buffer*/, torch::Device>;

class DecodeGraphSteps : public ::testing::TestWithParam<DecodeParam> {
 protected:
  void SetUp() override { devices::skip_unless_present(std::get<3>(GetParam())); }
};

// One MultiHeadAttention: prompt eagerly, then every further token through the graph.
TEST_P(DecodeGraphSteps, EqualTheFullForward) {
  const auto [backend, dtype, mask_buffer, device] = GetParam();
  const int64_t B = 2, C = 24, d = 16, prompt = 7, steps = 10;
  torch::manual_seed(41);
  torchattn::MultiHeadAttention mha(
      torchattn::MultiHeadAttentionOptions(d, d, C, 4).qkv_bias(true).backend(backend).mask_buffer(mask_buffer));
  mha->to(device, dtype);
  mha->eval();
  torch::NoGradGuard no_grad;
  auto x = torch::randn({B, prompt + steps, d}).to(device, dtype);
  auto full = mha(x);

  auto cache = mha->make_kv_cache(B, /*static_shapes=*/true);
  auto first = mha->forward_cached(x.narrow(1, 0, prompt), cache);
  EXPECT_TRUE(tol::close(first, full.narrow(1, 0, prompt), tol::for_dtype(dtype)));
  torchattn::DecodeGraph step([&](const torch::Tensor& t) { return mha->forward_cached(t, cache); }, {&cache});
  for (int64_t t = prompt; t < prompt + steps; ++t) {
    auto y = step(x.narrow(1, t, 1)).clone();
    ASSERT_EQ(cache.length(), t + 1);
    EXPECT_TRUE(tol::close(y, full.narrow(1, t, 1), tol::for_dtype(dtype))) << "token " << t;
  }
  EXPECT_EQ(step.tokens_per_step(), 1);
  EXPECT_EQ(step.uses_cuda_graph(), device.is_cuda());
  EXPECT_EQ(cache.position().item<int64_t>(), prompt + steps);

  // A new sequence in the same caches and graph: the position comes from the device.
  cache.reset();
  mha->forward_cached(x.narrow(1, 0, 3), cache);
  auto y = step(x.narrow(1, 3, 1));
  EXPECT_TRUE(tol::close(y, full.narrow(1, 3, 1), tol::for_dtype(dtype)));
  EXPECT_EQ(cache.length(), 4);
}

std::string decode_name(const ::testing::TestParamInfo<DecodeParam>& info) {
  const auto [backend, dtype, mask_buffer, device] = info.param;
  return devices::prefix(device) + std::string(torchattn::to_string(backend)) + "_" +
         std::string(c10::toString(dtype)) + (mask_buffer ? "" : "_no_mask_buffer");
}

INSTANTIATE_TEST_SUITE_P(Modules, DecodeGraphSteps,
                         ::testing::Combine(::testing::Values(Backend::Reference, Backend::SDPA, Backend::Auto),
                                            ::testing::Values(torch::kFloat32, torch::kBFloat16), ::testing::Bool(),
                                            ::testing::ValuesIn(devices::all())),
                         decode_name);

// A two-layer model whose step reads a position embedding at the caches' device
// position: what a GPT's decoding step does inside a graph.
class DecodeGraphModel : public ::testing::TestWithParam<torch::Device> {
 protected:
  void SetUp() override { devices::skip_unless_present(GetParam()); }
};

TEST_P(DecodeGraphModel, PositionsFromTheDeviceFeedEmbeddings) {
  const torch::Device device = GetParam();
  const int64_t C = 16, d = 8;
  torch::manual_seed(42);
  torchattn::MultiHeadAttention a(torchattn::MultiHeadAttentionOptions(d, d, C, 2).mask_buffer(false));
  torchattn::CausalAttention b(torchattn::CausalAttentionOptions(d, d, C));
  a->to(device);
  b->to(device);
  auto pos_emb = torch::randn({C, d}).to(device);
  torch::NoGradGuard no_grad;
  auto full_model = [&](const torch::Tensor& x) { return b(a(x + pos_emb.narrow(0, 0, x.size(1)))); };
  auto ca = a->make_kv_cache(1, true), cb = b->make_kv_cache(1, true);
  auto cached_model = [&](const torch::Tensor& x) {
    auto positions = ca.position() + torch::arange(x.size(1), ca.position().options());
    auto h = x + pos_emb.index_select(0, positions);
    return b->forward_cached(a->forward_cached(h, ca), cb);
  };
  auto x = torch::randn({1, 12, d}).to(device);
  auto full = full_model(x);
  auto prefix = cached_model(x.narrow(1, 0, 4));
  EXPECT_TRUE(tol::close(prefix, full.narrow(1, 0, 4), tol::for_dtype(torch::kFloat32)));
  torchattn::DecodeGraph step(cached_model, {&ca, &cb});
  for (int64_t t = 4; t < 12; ++t) {
    EXPECT_TRUE(tol::close(step(x.narrow(1, t, 1)), full.narrow(1, t, 1), tol::for_dtype(torch::kFloat32)))
        << "token " << t;
  }
  EXPECT_EQ(ca.length(), 12);
  EXPECT_EQ(cb.length(), 12);
  EXPECT_EQ(cb.position().item<int64_t>(), 12);
}

INSTANTIATE_TEST_SUITE_P(Devices, DecodeGraphModel, ::testing::ValuesIn(devices::all()),
                         [](const ::testing::TestParamInfo<torch::Device>& info) { return devices::name(info); });

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

// ---- misuse ----


TEST(DecodeGraphErrors, AreClearAndLeaveTheCachesUsable) {
  torch::manual_seed(43);
  torchattn::MultiHeadAttention mha(4, 4, 6, 0.0, 2);
  auto dynamic = mha->make_kv_cache(1);
  expect_error(
      [&] { torchattn::DecodeGraph g([](const torch::Tensor& t) { return t; }, {&dynamic}); },
      "DecodeGraph: cache 0 has dynamic shapes; make it with make_kv_cache(batch_size, /*static_shapes=*/true)");
  expect_error([&] { torchattn::DecodeGraph g(nullptr, {}); }, "DecodeGraph: expected a step function");
  torchattn::KVCache empty;
  expect_error([&] { torchattn::DecodeGraph g([](const torch::Tensor& t) { return t; }, {&empty}); },
               "DecodeGraph: cache 0 is null or empty");

  auto cache = mha->make_kv_cache(1, true);
  torchattn::DecodeGraph step([&](const torch::Tensor& t) { return mha->forward_cached(t, cache); }, {&cache});
  auto x = torch::randn({1, 1, 4});
  expect_error([&] { step(x); }, "DecodeGraph: run it under torch::NoGradGuard or c10::InferenceMode");
  torch::NoGradGuard no_grad;
  for (int i = 0; i < 6; ++i) step(x);
  EXPECT_EQ(cache.length(), 6);
  expect_error([&] { step(x); }, "would pass its capacity of 6");
  EXPECT_EQ(cache.length(), 6);
  cache.reset();
  expect_error([&] { step(torch::randn({1, 2, 4})); },
               "DecodeGraph: expected every input shaped like the first, [1, 1, 4]");
  EXPECT_EQ(step(x).sizes(), (std::vector<int64_t>{1, 1, 4}));

  // A step that advances only one of two caches.
  auto c1 = mha->make_kv_cache(1, true), c2 = mha->make_kv_cache(1, true);
  torchattn::DecodeGraph lopsided([&](const torch::Tensor& t) { return mha->forward_cached(t, c1); }, {&c1, &c2});
  expect_error([&] { lopsided(x); }, "DecodeGraph: the step added 0 tokens to cache 1 but 1 to cache 0");
}

class UnlistedCache : public ::testing::TestWithParam<torch::Device> {
 protected:
  void SetUp() override { devices::skip_unless_present(GetParam()); }
};

// A step that writes a cache it was not given: an error at the first call, naming the
// rule, and the listed cache is left as it was before the call (CUDA) or advanced
// (CPU, where the step ran eagerly).
TEST_P(UnlistedCache, IsAnErrorAtTheFirstCall) {
  const torch::Device device = GetParam();
  torchattn::MultiHeadAttention a(torchattn::MultiHeadAttentionOptions(8, 8, 16, 2)),
      b(torchattn::MultiHeadAttentionOptions(8, 8, 16, 2));
  a->to(device);
  b->to(device);
  a->eval();
  b->eval();
  torch::NoGradGuard no_grad;
  auto cache_a = a->make_kv_cache(1, true), cache_b = b->make_kv_cache(1, true);
  a->forward_cached(torch::randn({1, 2, 8}).to(device), cache_a);
  b->forward_cached(torch::randn({1, 2, 8}).to(device), cache_b);
  torchattn::DecodeGraph step(
      [&](const torch::Tensor& x) { return b->forward_cached(a->forward_cached(x, cache_a), cache_b); }, {&cache_a});
  expect_error([&] { step(torch::randn({1, 1, 8}).to(device)); },
               "DecodeGraph: the step wrote a KV cache (static shapes, 3 tokens) that is not among the 1 caches it "
               "was given; list every cache the step writes");
  // Listing both works.
  cache_a.truncate(2);
  cache_b.truncate(2);
  torchattn::DecodeGraph good(
      [&](const torch::Tensor& x) { return b->forward_cached(a->forward_cached(x, cache_a), cache_b); },
      {&cache_a, &cache_b});
  good(torch::randn({1, 1, 8}).to(device));
  good(torch::randn({1, 1, 8}).to(device));
  EXPECT_EQ(cache_a.length(), 4);
  EXPECT_EQ(cache_b.length(), 4);
}

INSTANTIATE_TEST_SUITE_P(Devices, UnlistedCache, ::testing::ValuesIn(devices::all()),
                         [](const auto& info) { return devices::name(info); });

TEST(KVCacheTruncate, RejectsLengthsOutsideTheCachedOnes) {
  torchattn::CausalAttention ca(4, 4, 6, 0.0);
  auto cache = ca->make_kv_cache(1, true);
  torch::NoGradGuard no_grad;
  ca->forward_cached(torch::randn({1, 3, 4}), cache);
  expect_error([&] { cache.truncate(4); }, "KVCache: truncate expected a length in [0, 3], got 4");
  expect_error([&] { cache.truncate(-1); }, "KVCache: truncate expected a length in [0, 3], got -1");
  cache.truncate(1);
  EXPECT_EQ(cache.length(), 1);
  EXPECT_EQ(cache.position().item<int64_t>(), 1);
}

}  // namespace

// The modules against the notebooks' Python code (tests/golden/modules.txt): weights
// after torch::manual_seed, outputs, gradients and dropout masks, on every backend.
// Then the backends and the KV cache against the Reference over shapes and dtypes;
// forward_cached on a non-causal module, and reset() on a built one.

#include "common/golden.h"
#include "common/devices.h"
#include "common/tolerances.h"
#include "common/expect_error.h"

#include <torchattn/torchattn.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

using torchattn::Backend;

namespace {

const golden::File& modules_file() {
  static const golden::File file = golden::load("modules.txt");
  return file;
}

std::optional<double> scale_of(const golden::Case& c) {
  return c.param("scale") == "none" ? std::nullopt : std::optional<double>(c.real("scale"));
}

// A module built as the Python code builds it, after torch::manual_seed(seed).
struct Built {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
};

Built build(const golden::Case& c, Backend backend) {
  const std::string kind = c.param("module");
  const auto d_in = c.integer("d_in"), d_out = c.integer("d_out");
  const bool bias = c.integer("qkv_bias") != 0;
  torch::manual_seed(c.integer("seed"));
  if (kind == "SelfAttentionV2") {
    torchattn::SelfAttentionV2 m(
        torchattn::SelfAttentionV2Options(d_in, d_out).qkv_bias(bias).scale(scale_of(c)).backend(backend));
    return {m.ptr(), [m](const torch::Tensor& x) mutable { return m(x); }};
  }
  if (kind == "CausalAttention") {
    torchattn::CausalAttention m(torchattn::CausalAttentionOptions(d_in, d_out, c.integer("context_length"))
                                     .dropout(c.real("dropout"))
                                     .qkv_bias(bias)
                                     .scale(scale_of(c))
                                     .backend(backend));
    return {m.ptr(), [m](const torch::Tensor& x) mutable { return m(x); }};
  }
  torchattn::MultiHeadAttention m(
      torchattn::MultiHeadAttentionOptions(d_in, d_out, c.integer("context_length"), c.integer("num_heads"))
          .dropout(c.real("dropout"))
          .qkv_bias(bias)
          .scale(scale_of(c))
          .backend(backend));
  return {m.ptr(), [m](const torch::Tensor& x) mutable { return m(x); }};
}

bool trains_with_dropout(const golden::Case& c) { return c.integer("training") != 0 && c.real("dropout") > 0.0; }

using GoldenParam = std::tuple<std::string, Backend>;

std::vector<GoldenParam> golden_params() {
  std::vector<GoldenParam> out;
  for (const auto& c : modules_file().cases) {
    for (Backend b : {Backend::Reference, Backend::Auto, Backend::SDPA}) {
      // SDPA's dropout draws another random stream: those cases are checked
      // statistically below, not against Python's masks.
      if (b == Backend::SDPA && trains_with_dropout(c)) continue;
      out.emplace_back(c.name, b);
    }
  }
  return out;
}

class GoldenModule : public ::testing::TestWithParam<GoldenParam> {};

TEST_P(GoldenModule, MatchesPythonWeightsOutputsAndGradients) {
  const auto& [name, backend] = GetParam();
  const auto& c = modules_file().get(name);
  const auto dtype = golden::dtype_from_name(c.param("dtype"));
  Built m = build(c, backend);

  // Same seed, same weights: exactly, before any dtype change.
  for (const auto& p : m.module->named_parameters()) {
    EXPECT_TRUE(torch::equal(p.value(), c.tensor("param." + p.key()).to(torch::kFloat32)))
        << p.key() << " differs from Python's initialisation";
  }
  EXPECT_EQ(m.module->named_parameters().size(), [&] {
    size_t n = 0;
    for (const auto& [k, t] : c.tensors) n += k.rfind("param.", 0) == 0;
    return n;
  }());

  m.module->to(dtype);
  m.module->train(c.integer("training") != 0);
  auto x = c.tensor("x").clone().requires_grad_(true);
  torch::manual_seed(c.integer("forward_seed"));
  auto y = m.forward(x);
  ASSERT_EQ(y.scalar_type(), dtype);
  EXPECT_TRUE(tol::close(y, c.tensor("y"))) << "output of " << name << " on " << backend;

  y.backward(c.tensor("grad_out"));
  EXPECT_TRUE(tol::close(x.grad(), c.tensor("grad_x"))) << "input gradient";
  for (const auto& p : m.module->named_parameters()) {
    EXPECT_TRUE(tol::close(p.value().grad(), c.tensor("grad." + p.key()))) << "gradient of " << p.key();
  }
}

INSTANTIATE_TEST_SUITE_P(Python, GoldenModule, ::testing::ValuesIn(golden_params()),
                         [](const ::testing::TestParamInfo<GoldenParam>& info) {
                           return std::get<0>(info.param) + "_" +
                                  std::string(torchattn::to_string(std::get<1>(info.param)));
                         });

TEST(GoldenModules, CoverEveryModuleDropoutDoubleAndUnbatchedInput) {
  int kinds[3] = {0, 0, 0};
  int dropout = 0, dbl = 0, unbatched = 0;
  for (const auto& c : modules_file().cases) {
    const auto& k = c.param("module");
    kinds[k == "SelfAttentionV2" ? 0 : k == "CausalAttention" ? 1 : 2]++;
    dropout += trains_with_dropout(c);
    dbl += c.param("dtype") == "float64";
    unbatched += c.integer("B") == 0;
  }
  EXPECT_GE(kinds[0], 5);
  EXPECT_GE(kinds[1], 10);
  EXPECT_GE(kinds[2], 10);
  EXPECT_GE(dropout, 5);
  EXPECT_GE(dbl, 5);
  EXPECT_GE(unbatched, 3);
}

// ---- state dicts and buffers ----

TEST(StateDict, KeysAreThePythonOnes) {
  torchattn::MultiHeadAttention mha(4, 6, 8, 0.1, 3, /*qkv_bias=*/true);
  std::vector<std::string> params, buffers;
  for (const auto& p : mha->named_parameters()) params.push_back(p.key());
  for (const auto& b : mha->named_buffers()) buffers.push_back(b.key());
  EXPECT_EQ(params, (std::vector<std::string>{"W_query.weight", "W_query.bias", "W_key.weight", "W_key.bias",
                                              "W_value.weight", "W_value.bias", "out_proj.weight", "out_proj.bias"}));
  EXPECT_EQ(buffers, std::vector<std::string>{"mask"});
  EXPECT_TRUE(torch::equal(mha->mask, torch::triu(torch::ones({8, 8}), 1)));

  torchattn::CausalAttention ca(3, 2, 6, 0.0);
  std::vector<std::string> ca_params;
  for (const auto& p : ca->named_parameters()) ca_params.push_back(p.key());
  EXPECT_EQ(ca_params, (std::vector<std::string>{"W_query.weight", "W_key.weight", "W_value.weight"}));
  EXPECT_EQ(ca->named_buffers().size(), 1u);
  EXPECT_EQ(ca->named_children().size(), 4u);  // W_query, W_key, W_value, dropout
}

TEST(StateDict, MaskBufferAndMathFollowToDouble) {
  torch::manual_seed(5);
  torchattn::MultiHeadAttention mha(4, 4, 6, 0.0, 2);
  auto x = torch::randn({2, 6, 4});
  auto y32 = mha(x);
  mha->to(torch::kFloat64);
  EXPECT_EQ(mha->mask.scalar_type(), torch::kFloat64);
  EXPECT_EQ(mha->named_buffers()["mask"].scalar_type(), torch::kFloat64);
  auto y64 = mha(x.to(torch::kFloat64));
  EXPECT_EQ(y64.scalar_type(), torch::kFloat64);
  EXPECT_TRUE(tol::close(y64.to(torch::kFloat32), y32, tol::for_dtype(torch::kFloat32)));
}

TEST(StateDict, CloneCopiesWeightsAndBuffer) {
  torchattn::CausalAttention ca(torchattn::CausalAttentionOptions(5, 3, 7).qkv_bias(true));
  auto copy = std::dynamic_pointer_cast<torchattn::CausalAttentionImpl>(ca->clone());
  ASSERT_TRUE(copy);
  auto x = torch::randn({2, 7, 5});
  EXPECT_TRUE(torch::equal(copy->forward(x), ca(x)));
  EXPECT_NE(copy->W_query->weight.data_ptr(), ca->W_query->weight.data_ptr());
}

TEST(Modules, PrettyPrintNamesTheConfiguration) {
  std::ostringstream s;
  s << *torchattn::MultiHeadAttention(3, 2, 6, 0.0, 2);
  EXPECT_NE(s.str().find("torchattn::MultiHeadAttention(d_in=3, d_out=2, context_length=6, num_heads=2"),
            std::string::npos)
      << s.str();
}

TEST(Modules, WorkInsideSequential) {
  torch::nn::Sequential seq(torchattn::CausalAttention(4, 4, 8, 0.0), torch::nn::Linear(4, 2));
  EXPECT_EQ(seq->forward(torch::randn({3, 8, 4})).sizes(), (std::vector<int64_t>{3, 8, 2}));
}

// ---- backends against the Reference, over shapes and dtypes ----

using BackendParam = std::tuple<int64_t /*B*/, int64_t /*T*/, int64_t /*heads*/, torch::Dtype, Backend, torch::Device>;

class BackendsAgree : public ::testing::TestWithParam<BackendParam> {
 protected:
  void SetUp() override { devices::skip_unless_present(std::get<5>(GetParam())); }
};

TEST_P(BackendsAgree, WithTheReferenceForwardAndBackward) {
  const auto [B, T, H, dtype, backend, device] = GetParam();
  const int64_t context_length = 97, d_in = 12, d_out = 4 * H;
  torch::manual_seed(1234 + B * 7 + T * 31 + H);
  torchattn::MultiHeadAttention ref(
      torchattn::MultiHeadAttentionOptions(d_in, d_out, context_length, H).qkv_bias(true).backend(Backend::Reference));
  auto other = std::dynamic_pointer_cast<torchattn::MultiHeadAttentionImpl>(ref->clone());
  other->options.backend(backend);
  // The reference runs in float64; the module under test in `dtype`.
  ref->to(torch::kFloat64);
  other->to(device, dtype);
  auto x = torch::randn({B, T, d_in}, torch::kFloat64);
  auto x64 = x.clone().requires_grad_(true);
  auto xd = x.to(device, dtype).requires_grad_(true);
  auto g = torch::randn({B, T, d_out}, torch::kFloat64);
  auto y_ref = ref(x64);
  auto y = other->forward(xd);
  ASSERT_EQ(y.scalar_type(), dtype);
  ASSERT_EQ(y.device(), device);
  // Half precision is bounded relative to a float32 run, float32 and float64 stated once.
  const auto t = tol::for_dtype(dtype);
  EXPECT_TRUE(tol::close(y, y_ref, t));
  y_ref.backward(g);
  y.backward(g.to(device, dtype));
  EXPECT_TRUE(tol::close(xd.grad(), x64.grad(), {t.rtol * 10, t.atol * 10})) << "input gradient";
  EXPECT_TRUE(tol::close(other->W_query->weight.grad(), ref->W_query->weight.grad(), {t.rtol * 10, t.atol * 10}));
}

std::string backend_param_name(const ::testing::TestParamInfo<BackendParam>& info) {
  const auto [B, T, H, dtype, backend, device] = info.param;
  return devices::prefix(device) + "B" + std::to_string(B) + "_T" + std::to_string(T) + "_H" + std::to_string(H) + "_" +
         std::string(c10::toString(dtype)) + "_" + std::string(torchattn::to_string(backend));
}

INSTANTIATE_TEST_SUITE_P(Shapes, BackendsAgree,
                         ::testing::Combine(::testing::Values(1, 3), ::testing::Values(1, 2, 17, 97),
                                            ::testing::Values(1, 3),
                                            ::testing::Values(torch::kFloat32, torch::kFloat64, torch::kBFloat16),
                                            ::testing::Values(Backend::Reference, Backend::SDPA, Backend::Auto),
                                            ::testing::ValuesIn(devices::all())),
                         backend_param_name);

TEST(Backends, AutoKeepsPythonDropoutMasksInTraining) {
  namespace F = torchattn::functional;
  EXPECT_EQ(F::resolve_backend({std::nullopt, 0.1, /*training=*/true, Backend::Auto}), Backend::Reference);
  EXPECT_EQ(F::resolve_backend({std::nullopt, 0.1, /*training=*/false, Backend::Auto}), Backend::SDPA);
  EXPECT_EQ(F::resolve_backend({std::nullopt, 0.0, /*training=*/true, Backend::Auto}), Backend::SDPA);
  EXPECT_EQ(F::resolve_backend({std::nullopt, 0.1, true, Backend::SDPA}), Backend::SDPA);
}

TEST(Backends, SdpaDropoutZeroesAboutPAndKeepsTheMean) {
  // SDPA's own dropout cannot match Python's masks; check what it must do.
  torch::manual_seed(0);
  const double p = 0.3;
  auto q = torch::randn({4, 2, 64, 8}), k = torch::randn({4, 2, 64, 8}), v = torch::ones({4, 2, 64, 8});
  namespace F = torchattn::functional;
  auto mask = F::causal_mask_buffer(64);
  auto y = F::attention(q, k, v, mask, 0, {std::nullopt, p, /*training=*/true, Backend::SDPA});
  auto y_eval = F::attention(q, k, v, mask, 0, {std::nullopt, p, /*training=*/false, Backend::SDPA});
  EXPECT_TRUE(tol::close(y_eval, torch::ones_like(y_eval)));  // weights sum to one, v = 1
  // With dropout each output is sum of kept weights / (1 - p): mean 1, not all 1.
  EXPECT_NEAR(y.mean().item<double>(), 1.0, 0.05);
  EXPECT_GT((y - 1).abs().max().item<double>(), 0.1);
}

TEST(Backends, ParseAndPrint) {
  EXPECT_EQ(torchattn::backend_from_string("sdpa"), Backend::SDPA);
  EXPECT_EQ(torchattn::to_string(Backend::Reference), "reference");
  try {
    torchattn::backend_from_string("flash");
    FAIL() << "expected c10::Error";
  } catch (const c10::Error& e) {
    EXPECT_NE(
        std::string(e.what_without_backtrace()).find("backend: expected one of auto, reference, sdpa, got 'flash'"),
        std::string::npos);
  }
}

// ---- KV cache ----

using CacheParam = std::tuple<bool /*multi-head*/, int64_t /*prompt*/, int64_t /*chunk*/, Backend, torch::Dtype,
                              bool /*static_shapes*/, torch::Device>;

class KVCacheMatchesFullForward : public ::testing::TestWithParam<CacheParam> {
 protected:
  void SetUp() override { devices::skip_unless_present(std::get<6>(GetParam())); }
};

TEST_P(KVCacheMatchesFullForward, PromptThenChunks) {
  const auto [multi_head, prompt, chunk, backend, dtype, static_shapes, device] = GetParam();
  const int64_t B = 2, C = 24, d_in = 10, d_out = 12, total = C;
  torch::manual_seed(77);
  torch::nn::AnyModule any;
  std::function<torch::Tensor(const torch::Tensor&, torchattn::KVCache&)> cached;
  torchattn::KVCache cache;
  if (multi_head) {
    torchattn::MultiHeadAttention m(
        torchattn::MultiHeadAttentionOptions(d_in, d_out, C, 3).qkv_bias(true).backend(backend));
    m->to(device, dtype);
    any = torch::nn::AnyModule(m);
    cache = m->make_kv_cache(B, static_shapes);
    cached = [m](const torch::Tensor& x, torchattn::KVCache& c) mutable { return m->forward_cached(x, c); };
  } else {
    torchattn::CausalAttention m(torchattn::CausalAttentionOptions(d_in, d_out, C).backend(backend));
    m->to(device, dtype);
    any = torch::nn::AnyModule(m);
    cache = m->make_kv_cache(B, static_shapes);
    cached = [m](const torch::Tensor& x, torchattn::KVCache& c) mutable { return m->forward_cached(x, c); };
  }
  torch::NoGradGuard no_grad;
  auto x = torch::randn({B, total, d_in}).to(device, dtype);
  auto full = any.forward(x);
  EXPECT_EQ(cache.static_shapes(), static_shapes);
  std::vector<torch::Tensor> parts{cached(x.narrow(1, 0, prompt), cache)};
  EXPECT_EQ(cache.length(), prompt);
  EXPECT_EQ(cache.position().item<int64_t>(), prompt);
  for (int64_t t = prompt; t < total; t += chunk) {
    const int64_t n = std::min(chunk, total - t);
    parts.push_back(cached(x.narrow(1, t, n), cache));
  }
  EXPECT_EQ(cache.length(), total);
  EXPECT_TRUE(tol::close(torch::cat(parts, 1), full, tol::for_dtype(dtype)));

  // Past context_length: a clear error, and the cache is unchanged.
  try {
    cached(x.narrow(1, 0, 1), cache);
    FAIL() << "expected c10::Error past context_length";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("would pass its capacity of 24"), std::string::npos)
        << e.what_without_backtrace();
  }
  EXPECT_EQ(cache.length(), total);
  cache.reset();
  EXPECT_EQ(cache.length(), 0);
  EXPECT_EQ(cache.position().item<int64_t>(), 0);
  EXPECT_TRUE(tol::close(cached(x.narrow(1, 0, 5), cache), full.narrow(1, 0, 5), tol::for_dtype(dtype)));
  // Going back three tokens and on again gives the same rows.
  cache.truncate(2);
  EXPECT_EQ(cache.position().item<int64_t>(), 2);
  EXPECT_TRUE(tol::close(cached(x.narrow(1, 2, 3), cache), full.narrow(1, 2, 3), tol::for_dtype(dtype)));
}

std::string cache_param_name(const ::testing::TestParamInfo<CacheParam>& info) {
  const auto [mh, prompt, chunk, backend, dtype, static_shapes, device] = info.param;
  return devices::prefix(device) + std::string(static_shapes ? "Static" : "") + std::string(mh ? "MHA" : "Causal") +
         "_prompt" + std::to_string(prompt) + "_chunk" + std::to_string(chunk) + "_" +
         std::string(torchattn::to_string(backend)) + "_" + std::string(c10::toString(dtype));
}

INSTANTIATE_TEST_SUITE_P(Decode, KVCacheMatchesFullForward,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(1, 7, 24), ::testing::Values(1, 5),
                                            ::testing::Values(Backend::Reference, Backend::SDPA),
                                            ::testing::Values(torch::kFloat32, torch::kFloat64, torch::kBFloat16),
                                            ::testing::Bool(), ::testing::ValuesIn(devices::all())),
                         cache_param_name);

TEST(KVCache, UnbatchedInputUsesABatchOfOne) {
  torch::manual_seed(3);
  torchattn::MultiHeadAttention mha(4, 4, 8, 0.0, 2);
  torch::NoGradGuard no_grad;
  auto x = torch::randn({6, 4});
  auto cache = mha->make_kv_cache(1);
  auto a = mha->forward_cached(x.narrow(0, 0, 4), cache);
  auto b = mha->forward_cached(x.narrow(0, 4, 2), cache);
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{4, 4}));
  EXPECT_TRUE(tol::close(torch::cat({a, b}, 0), mha(x)));
}

// ---- devices ----

// Every device-parametrized test is instantiated for CUDA in a build against a CUDA
// LibTorch; those instances skip on a machine without a device. make test-gpu sets
// TORCHATTN_REQUIRE_CUDA=1: there, a missing CUDA device fails here (and in every
// CUDA instance) instead of being skipped.
TEST(Devices, CudaIsPresentWhereRequired) {
  std::printf("[devices] device-parametrized tests are instantiated for:");
  for (const auto& d : devices::all()) std::printf(" %s", d.str().c_str());
  std::printf("; present:");
  for (const auto& d : devices::present()) std::printf(" %s", d.str().c_str());
  std::printf("\n");
  EXPECT_EQ(devices::all().size(), devices::cuda_build() ? 2u : 1u);
  if (devices::cuda_required()) {
    ASSERT_TRUE(devices::cuda_build()) << "TORCHATTN_REQUIRE_CUDA=1 but the tests were built against a CPU LibTorch";
    ASSERT_TRUE(torch::cuda::is_available()) << "TORCHATTN_REQUIRE_CUDA=1 but this LibTorch sees no CUDA device";
  }
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
  EXPECT_HAS(message,
             name +
                 "::reset: expected a module without its layers (reset() builds them once: the "
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

}  // namespace

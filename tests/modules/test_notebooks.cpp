// The values the notebooks print, from tests/golden/notebooks.txt (tests/reference/make_golden.py
// ran the notebooks' code to make them). Then the three modules against the notebook
// math written out in float64 on 600 random configurations (every backend, dtype, cache
// and padding), and finite-difference gradient checks.

#include "common/golden.h"
#include "common/devices.h"
#include "common/tolerances.h"

#include <torchattn/torchattn.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace F = torchattn::functional;
using torchattn::Backend;

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
  EXPECT_TRUE(
      tol::close(F::dot_product_attention_weights(q, k, torch::tril(torch::ones({2, 2}))), c.tensor("causal_weights")));
  EXPECT_TRUE(tol::close(F::causal_dot_product_attention(q, k, v), c.tensor("causal_output")));
  EXPECT_TRUE(
      tol::close(F::causal_dot_product_attention(q, k, v, /*scale=*/false), c.tensor("causal_output_unscaled")));
  EXPECT_NEAR(F::causal_dot_product_attention(q, k, v)[1][0].item<double>(), 0.8497, 5e-5);
}

// 004: make_causal_mask and softmax(scores + mask) @ V with batch and heads.
TEST(Notebook004, MakeCausalMaskBroadcastsOverBatchAndHeads) {
  const auto& c = notebooks().get("notebook004_causal_mask");
  auto mask = F::make_causal_mask(4);
  EXPECT_EQ(mask.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(tol::close(mask, c.tensor("causal_mask"), {0.0, 0.0}));
  EXPECT_TRUE(
      tol::close(F::make_causal_mask(7, -100.0, torch::kFloat64), c.tensor("causal_mask_T7_neg100"), {0.0, 0.0}));

  const auto scores = c.tensor("scores");  // [2, 3, 4, 4] float64
  auto attn = torch::softmax(scores + F::make_causal_mask(4, -1e9, torch::kFloat64), -1);
  EXPECT_TRUE(tol::close(attn, c.tensor("Attn")));
  EXPECT_TRUE(tol::close(attn.matmul(c.tensor("V")), c.tensor("output")));
  // The additive mask and the -inf fill agree.
  EXPECT_TRUE(tol::close(F::masked_softmax(scores, F::causal_mask_buffer(4)), c.tensor("Attn")));
}


// ---------------------------------------------------------------------------
// The notebook math, written out in float64 from a module's weights: the reference
// every backend, dtype and the cache are checked against. Padding follows the
// library's documented rule: hidden keys get -inf, a row with nothing to see is 0.
// ---------------------------------------------------------------------------
struct Weights {
  torch::Tensor Wq, Wk, Wv, bq, bk, bv, Wo, bo;  // b*/Wo/bo may be undefined
};

torch::Tensor notebook_math(const torch::Tensor& x /*[B,T,d_in]*/, const Weights& w, int64_t num_heads, bool causal,
                            std::optional<double> scale, const torch::Tensor& pad /*[B,T] bool or undefined*/) {
  auto lin = [](const torch::Tensor& x, const torch::Tensor& W, const torch::Tensor& b) {
    auto y = x.matmul(W.t());
    return b.defined() ? y + b : y;
  };
  const int64_t B = x.size(0), T = x.size(1);
  auto q = lin(x, w.Wq, w.bq), k = lin(x, w.Wk, w.bk), v = lin(x, w.Wv, w.bv);
  const int64_t d_out = q.size(-1), H = std::max<int64_t>(num_heads, 1), hd = d_out / H;
  q = q.view({B, T, H, hd}).transpose(1, 2);
  k = k.view({B, T, H, hd}).transpose(1, 2);
  v = v.view({B, T, H, hd}).transpose(1, 2);
  auto scores = q.matmul(k.transpose(2, 3));
  auto hide = torch::zeros({B, 1, T, T}, torch::kBool);
  if (causal) hide = hide | torch::triu(torch::ones({T, T}, torch::kBool), 1);
  if (pad.defined()) hide = hide | pad.view({B, 1, 1, T});
  scores = scores.masked_fill(hide, -std::numeric_limits<double>::infinity());
  scores = scale ? scores * *scale : scores / std::sqrt(static_cast<double>(hd));
  auto weights = torch::softmax(scores, -1);
  weights = weights.masked_fill(hide.all(-1, true), 0.0);  // rows with nothing to see
  auto ctx = weights.matmul(v).transpose(1, 2).reshape({B, T, d_out});
  return w.Wo.defined() ? lin(ctx, w.Wo, w.bo) : ctx;
}

// ---------------------------------------------------------------------------
// Property tests: >= 500 reproducible random configurations.
// ---------------------------------------------------------------------------
enum class Kind { SelfAttentionV2, CausalAttention, MultiHeadAttention };

struct Config {
  int index;
  Kind kind;
  int64_t B, T, C, d_in, d_out, heads;
  bool bias;
  std::optional<double> scale;
  torch::Dtype dtype;
  Backend backend;
  bool cache;
  bool padding;
  bool mask_buffer;   // false: causal from positions, no buffer
  bool static_cache;  // a static-shape KV cache (when cache)
  torch::Device device = torch::kCPU;
};

std::string describe(const Config& c) {
  std::ostringstream s;
  const char* kinds[] = {"SelfAttentionV2", "CausalAttention", "MultiHeadAttention"};
  s << "config #" << c.index << ": " << kinds[static_cast<int>(c.kind)] << " B=" << c.B << " T=" << c.T
    << " context_length=" << c.C << " d_in=" << c.d_in << " d_out=" << c.d_out << " heads=" << c.heads
    << " qkv_bias=" << c.bias << " scale=" << (c.scale ? std::to_string(*c.scale) : "default")
    << " dtype=" << c10::toString(c.dtype) << " backend=" << c.backend << " cache=" << c.cache
    << " padding=" << c.padding << " mask_buffer=" << c.mask_buffer << " static_cache=" << c.static_cache
    << " device=" << c.device;
  return s.str();
}

constexpr int kPropertyConfigs = 600;

std::vector<Config> property_configs() {
  std::mt19937 rng(20261122);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const torch::Dtype dtypes[] = {torch::kFloat32, torch::kFloat64, torch::kBFloat16, torch::kFloat16};
  const Backend backends[] = {Backend::Reference, Backend::SDPA, Backend::Auto};
  std::vector<Config> out;
  for (int i = 0; i < kPropertyConfigs; ++i) {
    Config c{};
    c.index = i;
    c.kind = static_cast<Kind>(i % 3);
    c.B = pick(1, 3);
    c.C = pick(1, 40);
    const int64_t t_kind = pick(0, 3);  // 1, exactly C, odd, anything
    c.T = t_kind == 0   ? 1
          : t_kind == 1 ? c.C
          : t_kind == 2 ? std::min<int64_t>(c.C, 2 * pick(0, 20) + 1)
                        : pick(1, c.C);
    c.d_in = pick(1, 12);
    c.heads = c.kind == Kind::MultiHeadAttention ? pick(1, 4) : 0;
    c.d_out = c.kind == Kind::MultiHeadAttention ? c.heads * pick(1, 6) : pick(1, 12);
    c.bias = pick(0, 1) == 1;
    if (pick(0, 3) == 0) c.scale = 0.05 * static_cast<double>(pick(1, 30));
    c.dtype = dtypes[i / 3 % 4];
    c.backend = backends[i / 12 % 3];
    c.cache = c.kind != Kind::SelfAttentionV2 && pick(0, 2) == 0;
    c.padding = !c.cache && pick(0, 3) == 0;
    if (c.kind == Kind::SelfAttentionV2) c.C = c.T;
    c.mask_buffer = pick(0, 2) != 0;
    c.static_cache = c.cache && pick(0, 1) == 1;
    out.push_back(c);
  }
  // The same configurations on every other device.
  const size_t n = out.size();
  for (const auto& device : devices::all()) {
    if (device.is_cpu()) continue;
    for (size_t i = 0; i < n; ++i) {
      Config c = out[i];
      c.device = device;
      out.push_back(c);
    }
  }
  return out;
}

struct ModuleUnderTest {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)> forward;
  std::function<torch::Tensor(const torch::Tensor&, int64_t)> forward_in_chunks;  // cache, else null
  Weights weights() const {
    auto p = module->named_parameters();
    auto get = [&](const std::string& k) {
      return p.contains(k) ? p[k].detach().cpu().to(torch::kFloat64) : torch::Tensor();
    };
    return {get("W_query.weight"), get("W_key.weight"), get("W_value.weight"),  get("W_query.bias"),
            get("W_key.bias"),     get("W_value.bias"), get("out_proj.weight"), get("out_proj.bias")};
  }
};

ModuleUnderTest make_module(Kind kind, int64_t d_in, int64_t d_out, int64_t C, int64_t heads, bool bias,
                            std::optional<double> scale, Backend backend, bool mask_buffer = true,
                            bool static_cache = false) {
  if (kind == Kind::SelfAttentionV2) {
    torchattn::SelfAttentionV2 m(
        torchattn::SelfAttentionV2Options(d_in, d_out).qkv_bias(bias).scale(scale).backend(backend));
    return {m.ptr(), [m](const torch::Tensor& x, const torch::Tensor& p) mutable { return m(x, p); }, nullptr};
  }
  if (kind == Kind::CausalAttention) {
    torchattn::CausalAttention m(torchattn::CausalAttentionOptions(d_in, d_out, C)
                                     .qkv_bias(bias)
                                     .scale(scale)
                                     .backend(backend)
                                     .mask_buffer(mask_buffer));
    return {m.ptr(), [m](const torch::Tensor& x, const torch::Tensor& p) mutable { return m(x, p); },
            [m, static_cache](const torch::Tensor& x, int64_t split) mutable {
              auto cache = m->make_kv_cache(x.size(0), static_cache);
              auto a = m->forward_cached(x.narrow(1, 0, split), cache);
              std::vector<torch::Tensor> parts{a};
              for (int64_t t = split; t < x.size(1); ++t) parts.push_back(m->forward_cached(x.narrow(1, t, 1), cache));
              return torch::cat(parts, 1);
            }};
  }
  torchattn::MultiHeadAttention m(torchattn::MultiHeadAttentionOptions(d_in, d_out, C, heads)
                                      .qkv_bias(bias)
                                      .scale(scale)
                                      .backend(backend)
                                      .mask_buffer(mask_buffer));
  return {m.ptr(), [m](const torch::Tensor& x, const torch::Tensor& p) mutable { return m(x, p); },
          [m, static_cache](const torch::Tensor& x, int64_t split) mutable {
            auto cache = m->make_kv_cache(x.size(0), static_cache);
            auto a = m->forward_cached(x.narrow(1, 0, split), cache);
            std::vector<torch::Tensor> parts{a};
            for (int64_t t = split; t < x.size(1); t += 2) {
              parts.push_back(m->forward_cached(x.narrow(1, t, std::min<int64_t>(2, x.size(1) - t)), cache));
            }
            return torch::cat(parts, 1);
          }};
}

struct ErrorLog {
  std::mutex mu;
  std::map<std::string, double> max_error;
  std::map<std::string, int> runs;
  ~ErrorLog() {
    std::printf("\n[property] configurations run per dtype, and the largest error against float64 notebook math:\n");
    for (auto& [k, v] : max_error)
      std::printf("[property]   %-9s %4d configs  max abs error %.3e\n", k.c_str(), runs[k], v);
  }
} error_log;

class Property : public ::testing::TestWithParam<Config> {
 protected:
  void SetUp() override { devices::skip_unless_present(GetParam().device); }
};

TEST_P(Property, MatchesTheNotebookMathInFloat64) {
  const Config c = GetParam();
  SCOPED_TRACE(describe(c));
  torch::manual_seed(c.index);
  auto m = make_module(c.kind, c.d_in, c.d_out, c.C, c.heads, c.bias, c.scale, c.backend, c.mask_buffer,
                       c.static_cache);
  m.module->to(c.device, c.dtype);
  m.module->eval();
  auto x = torch::randn({c.B, c.T, c.d_in}, torch::kFloat64).to(c.dtype);  // rounded once
  torch::Tensor pad;
  if (c.padding) {
    pad = torch::rand({c.B, c.T}) < 0.3;
    pad.select(1, c.T - 1).fill_(false);  // every sequence keeps a key (else an error on the CPU)
  }
  const auto on_device = [&](const torch::Tensor& t) { return t.defined() ? t.to(c.device) : t; };
  const bool causal = c.kind != Kind::SelfAttentionV2;
  const Weights w = m.weights();  // the module's own (rounded) weights, in float64
  std::optional<double> scale = c.scale;
  if (!scale && c.kind == Kind::SelfAttentionV2) {
    scale = 1.0 / static_cast<double>(std::sqrt(static_cast<float>(c.d_out)));  // as its notebook
  }
  auto expected = notebook_math(x.to(torch::kFloat64), w, c.heads, causal, scale, pad);

  torch::Tensor y;
  {
    torch::NoGradGuard no_grad;
    y = c.cache ? m.forward_in_chunks(on_device(x), std::max<int64_t>(1, c.T / 2))
                : m.forward(on_device(x), on_device(pad));
    ASSERT_EQ(y.device(), c.device);
    y = y.cpu();
  }
  ASSERT_EQ(y.scalar_type(), c.dtype);
  ASSERT_FALSE(y.isnan().any().item<bool>()) << "NaN in the output";
  const double err = (y.to(torch::kFloat64) - expected).abs().max().item<double>();
  {
    std::lock_guard<std::mutex> lock(error_log.mu);
    auto key = std::string(c10::toString(c.dtype));
    error_log.max_error[key] = std::max(error_log.max_error[key], err);
    error_log.runs[key]++;
  }
  if (c.dtype == torch::kFloat32 || c.dtype == torch::kFloat64) {
    EXPECT_TRUE(tol::close(y, expected, tol::for_dtype(c.dtype)));
  } else {
    // flash-attention's rule: within a few times the error of the plain math run in
    // the same half precision, plus rounding of one output.
    Weights wh = w;
    for (auto* t : {&wh.Wq, &wh.Wk, &wh.Wv, &wh.bq, &wh.bk, &wh.bv, &wh.Wo, &wh.bo}) {
      if (t->defined()) *t = t->to(c.dtype);
    }
    auto plain = notebook_math(x, wh, c.heads, causal, scale, pad).to(torch::kFloat64);
    const double plain_err = (plain - expected).abs().max().item<double>();
    const double out_eps = (c.dtype == torch::kBFloat16 ? 7.8e-3 : 9.8e-4) * (expected.abs().max().item<double>() + 1);
    EXPECT_LE(err, 3 * plain_err + out_eps) << "plain " << c10::toString(c.dtype) << " math error " << plain_err;
  }
}

INSTANTIATE_TEST_SUITE_P(Random, Property, ::testing::ValuesIn(property_configs()),
                         [](const ::testing::TestParamInfo<Config>& info) {
                           return devices::prefix(info.param.device) + "n" + std::to_string(info.param.index);
                         });

// ---------------------------------------------------------------------------
// Finite-difference gradient checks in float64: inputs and every parameter.
// ---------------------------------------------------------------------------
using GradParam = std::tuple<Kind, Backend, bool /*padding*/, bool /*mask_buffer*/, torch::Device>;

class GradCheck : public ::testing::TestWithParam<GradParam> {
 protected:
  void SetUp() override { devices::skip_unless_present(std::get<4>(GetParam())); }
};

TEST_P(GradCheck, AnalyticGradientsMatchCentralDifferences) {
  const auto [kind, backend, padding, mask_buffer, device] = GetParam();
  torch::manual_seed(11);
  auto m = make_module(kind, 3, 4, 5, 2, /*bias=*/true, std::nullopt, backend, mask_buffer);
  m.module->to(device, torch::kFloat64);
  auto x = torch::randn({2, 5, 3}, torch::kFloat64).to(device).requires_grad_(true);
  auto g = torch::randn({2, 5, 4}, torch::kFloat64).to(device);
  torch::Tensor pad;
  if (padding) pad = torch::tensor({{true, false, false, true, false}, {false, false, true, true, true}}).to(device);
  auto loss = [&] { return (m.forward(x, pad) * g).sum(); };
  loss().backward();
  std::vector<std::pair<std::string, torch::Tensor>> inputs{{"input", x}};
  for (auto& p : m.module->named_parameters()) inputs.emplace_back(p.key(), p.value());
  const double eps = 1e-6;
  torch::NoGradGuard no_grad;
  for (auto& [name, t] : inputs) {
    auto flat = t.view(-1);
    auto grad = t.grad().view(-1);
    ASSERT_TRUE(torch::isfinite(grad).all().item<bool>()) << name;
    for (int64_t i = 0; i < flat.numel(); ++i) {
      const double orig = flat[i].item<double>();
      flat[i] = orig + eps;
      const double up = loss().item<double>();
      flat[i] = orig - eps;
      const double down = loss().item<double>();
      flat[i] = orig;
      const double numeric = (up - down) / (2 * eps);
      EXPECT_NEAR(grad[i].item<double>(), numeric, 1e-6 + 1e-5 * std::abs(numeric)) << name << "[" << i << "]";
    }
  }
}

std::string grad_param_name(const ::testing::TestParamInfo<GradParam>& info) {
  const auto [kind, backend, padding, mask_buffer, device] = info.param;
  const char* kinds[] = {"SelfAttentionV2", "CausalAttention", "MultiHeadAttention"};
  return devices::prefix(device) + kinds[static_cast<int>(kind)] + "_" + std::string(torchattn::to_string(backend)) +
         (padding ? "_padding" : "") + (mask_buffer ? "" : "_no_mask_buffer");
}

INSTANTIATE_TEST_SUITE_P(Float64, GradCheck,
                         ::testing::Combine(::testing::Values(Kind::SelfAttentionV2, Kind::CausalAttention,
                                                              Kind::MultiHeadAttention),
                                            ::testing::Values(Backend::Reference, Backend::SDPA, Backend::Auto),
                                            ::testing::Bool(), ::testing::Bool(), ::testing::ValuesIn(devices::all())),
                         grad_param_name);

}  // namespace

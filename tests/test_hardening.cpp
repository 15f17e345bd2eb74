// Hardening: property tests against the notebook math in float64, finite-difference
// gradient checks, key padding masks and biases, fully masked rows, half-precision
// numerics and concurrent forwards.

#include "devices.h"
#include "tolerances.h"

#include <torchattn/torchattn.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

using torchattn::Backend;

namespace {

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
    c.T = t_kind == 0 ? 1 : t_kind == 1 ? c.C : t_kind == 2 ? std::min<int64_t>(c.C, 2 * pick(0, 20) + 1) : pick(1, c.C);
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
    auto get = [&](const std::string& k) { return p.contains(k) ? p[k].detach().cpu().to(torch::kFloat64) : torch::Tensor(); };
    return {get("W_query.weight"), get("W_key.weight"), get("W_value.weight"), get("W_query.bias"),
            get("W_key.bias"),     get("W_value.bias"), get("out_proj.weight"), get("out_proj.bias")};
  }
};

ModuleUnderTest make_module(Kind kind, int64_t d_in, int64_t d_out, int64_t C, int64_t heads, bool bias,
                            std::optional<double> scale, Backend backend, bool mask_buffer = true,
                            bool static_cache = false) {
  if (kind == Kind::SelfAttentionV2) {
    torchattn::SelfAttentionV2 m(torchattn::SelfAttentionV2Options(d_in, d_out).qkv_bias(bias).scale(scale).backend(backend));
    return {m.ptr(), [m](const torch::Tensor& x, const torch::Tensor& p) mutable { return m(x, p); }, nullptr};
  }
  if (kind == Kind::CausalAttention) {
    torchattn::CausalAttention m(
        torchattn::CausalAttentionOptions(d_in, d_out, C).qkv_bias(bias).scale(scale).backend(backend).mask_buffer(
            mask_buffer));
    return {m.ptr(), [m](const torch::Tensor& x, const torch::Tensor& p) mutable { return m(x, p); },
            [m, static_cache](const torch::Tensor& x, int64_t split) mutable {
              auto cache = m->make_kv_cache(x.size(0), static_cache);
              auto a = m->forward_cached(x.narrow(1, 0, split), cache);
              std::vector<torch::Tensor> parts{a};
              for (int64_t t = split; t < x.size(1); ++t) parts.push_back(m->forward_cached(x.narrow(1, t, 1), cache));
              return torch::cat(parts, 1);
            }};
  }
  torchattn::MultiHeadAttention m(
      torchattn::MultiHeadAttentionOptions(d_in, d_out, C, heads).qkv_bias(bias).scale(scale).backend(backend).mask_buffer(
          mask_buffer));
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
    for (auto& [k, v] : max_error) std::printf("[property]   %-9s %4d configs  max abs error %.3e\n", k.c_str(), runs[k], v);
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
    y = c.cache ? m.forward_in_chunks(on_device(x), std::max<int64_t>(1, c.T / 2)) : m.forward(on_device(x), on_device(pad));
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

INSTANTIATE_TEST_SUITE_P(
    Float64, GradCheck,
    ::testing::Combine(::testing::Values(Kind::SelfAttentionV2, Kind::CausalAttention, Kind::MultiHeadAttention),
                       ::testing::Values(Backend::Reference, Backend::SDPA, Backend::Auto), ::testing::Bool(),
                       ::testing::Bool(), ::testing::ValuesIn(devices::all())),
    grad_param_name);

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
  EXPECT_TRUE(tol::close(mha->forward(x, pad, bias), mha->forward(x, pad.expand({3, 7}).contiguous(), bias.expand({3, 7}).contiguous())));
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
  auto pad = torch::tensor({{true, false, false, false, false, false}, {true, true, true, false, false, false}})
                 .to(device());
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
  EXPECT_EQ(any.forward(x, torch::zeros({1, 6}, torch::TensorOptions(torch::kBool).device(device()))).sizes(), x.sizes());
}

INSTANTIATE_TEST_SUITE_P(Backends, Masks,
                         ::testing::Combine(::testing::Values(Backend::Reference, Backend::SDPA, Backend::Auto),
                                            ::testing::ValuesIn(devices::all())),
                         [](const ::testing::TestParamInfo<MaskParam>& info) {
                           return devices::prefix(std::get<1>(info.param)) +
                                  std::string(torchattn::to_string(std::get<0>(info.param)));
                         });

// ---------------------------------------------------------------------------
// Numerics: scores of +/-1e4 in half precision.
// ---------------------------------------------------------------------------
using NumericsParam = std::tuple<torch::Dtype, Backend>;
class Numerics : public ::testing::TestWithParam<NumericsParam> {};

TEST_P(Numerics, LargeScoresStayFiniteAndMatchFloat32) {
  const auto [dtype, backend] = GetParam();
  namespace F = torchattn::functional;
  // q . k = +/-1e4 for some pairs: exp would overflow any float without max-subtraction.
  auto q = torch::tensor({100.f, 0.f, -100.f, 0.f, 0.f, 100.f, 50.f, 50.f}).view({1, 1, 4, 2});
  auto k = torch::tensor({100.f, 0.f, -100.f, 0.f, 0.f, -100.f, 60.f, 40.f}).view({1, 1, 4, 2});
  auto v = torch::randn({1, 1, 4, 3});
  auto mask = F::causal_mask_buffer(4);
  const F::AttentionConfig cfg{1.0, 0.0, false, backend};
  auto ref = F::attention(q, k, v, mask, 0, cfg);
  auto got = F::attention(q.to(dtype), k.to(dtype), v.to(dtype), mask.to(dtype), 0, cfg);
  ASSERT_TRUE(torch::isfinite(ref).all().item<bool>());
  ASSERT_TRUE(torch::isfinite(got).all().item<bool>()) << got;
  EXPECT_TRUE(tol::close(got, ref, tol::for_dtype(dtype)));
  auto w = F::attention_weights(q.to(dtype), k.to(dtype), mask.to(dtype), 0, 1.0);
  ASSERT_TRUE(torch::isfinite(w).all().item<bool>());
  EXPECT_TRUE(tol::close(w.sum(-1), torch::ones({1, 1, 4}), tol::for_dtype(dtype)));
}

INSTANTIATE_TEST_SUITE_P(Half, Numerics,
                         ::testing::Combine(::testing::Values(torch::kFloat16, torch::kBFloat16, torch::kFloat32),
                                            ::testing::Values(Backend::Reference, Backend::SDPA)));

// ---------------------------------------------------------------------------
// Concurrency: eight threads on one module in eval mode.
// ---------------------------------------------------------------------------
class Concurrency : public ::testing::TestWithParam<Backend> {};

TEST_P(Concurrency, EightThreadsGetTheSerialResults) {
  torch::manual_seed(31);
  torchattn::MultiHeadAttention mha(torchattn::MultiHeadAttentionOptions(16, 16, 32, 4).dropout(0.2).backend(GetParam()));
  mha->eval();
  std::vector<torch::Tensor> xs, serial;
  for (int i = 0; i < 8; ++i) {
    xs.push_back(torch::randn({2, 1 + 4 * i, 16}));
    serial.push_back(mha(xs.back()).detach());
  }
  std::vector<std::vector<torch::Tensor>> got(8);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      torch::NoGradGuard no_grad;
      for (int r = 0; r < 10; ++r) got[i].push_back(mha(xs[(i + r) % 8]));
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 8; ++i) {
    for (int r = 0; r < 10; ++r) EXPECT_TRUE(torch::equal(got[i][r], serial[(i + r) % 8])) << "thread " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Concurrency, ::testing::Values(Backend::Reference, Backend::SDPA, Backend::Auto));

} // namespace

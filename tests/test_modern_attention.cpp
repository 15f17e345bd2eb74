// The attention of today's models (grouped-query heads, RoPE, sliding windows,
// non-causal encoders, out_proj without bias) against a float64 reference written
// out here, independently of the library: random configurations over every
// backend, dtype, padding, dynamic and static caches and the mask buffer, on every
// device present. Also: the defaults build what the notebooks build, the new
// options' errors, checkpoints that record them, and GQA's smaller cache.

#include "devices.h"
#include "tolerances.h"

#include <torchattn/torchattn.h>

#include "../src/detail/rotary_cache.h"
#include "../src/kernels/cpu/rotary.h"
#include "temp_path.h"

#include "expect_error.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <random>
#include <sstream>
#include <string>

#include <unistd.h>

using torchattn::Backend;
using torchattn::RMSNorm;
using torchattn::RoPEOptions;

namespace {

struct ModernConfig {
  int index;
  int64_t B, T, C, d_in, heads, kv_heads, head_dim;
  int64_t d_out = 0;  // > 0: head_dim given as an option, out_proj maps heads * head_dim to d_out
  int qk_norm = 0;    // 0: none; 1: QK-norm of each head (Qwen3); 2: of all the heads' features (OLMo 2)
  bool alibi = false;
  double softcap = 0.0;  // > 0: Gemma 2's softcapping
  bool sinks = false;    // gpt-oss' attention sinks
  bool causal, qkv_bias, out_bias;
  std::optional<int64_t> window;
  std::optional<RoPEOptions> rope;
  torch::Dtype dtype;
  Backend backend;
  bool padding, cache, static_cache, mask_buffer;
  torch::Device device = torch::kCPU;
};

std::string describe_modern(const ModernConfig& c) {
  std::ostringstream s;
  s << "config #" << c.index << ": B=" << c.B << " T=" << c.T << " C=" << c.C << " d_in=" << c.d_in
    << " heads=" << c.heads << " kv_heads=" << c.kv_heads << " head_dim=" << c.head_dim << " d_out=" << c.d_out << " qk_norm=" << c.qk_norm << " alibi=" << c.alibi << " softcap=" << c.softcap << " sinks=" << c.sinks
    << " causal=" << c.causal
    << " qkv_bias=" << c.qkv_bias << " out_bias=" << c.out_bias << " window=" << c.window.value_or(0);
  if (c.rope) {
    s << " rope(theta=" << c.rope->theta() << ", interleaved=" << c.rope->interleaved()
      << ", rotary_dim=" << c.rope->rotary_dim().value_or(0) << ")";
  }
  s << " dtype=" << c10::toString(c.dtype) << " backend=" << c.backend << " padding=" << c.padding
    << " cache=" << c.cache << " static=" << c.static_cache << " mask_buffer=" << c.mask_buffer
    << " device=" << c.device;
  return s.str();
}

std::vector<ModernConfig> modern_configs() {
  std::mt19937 rng(20261123);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const torch::Dtype dtypes[] = {torch::kFloat32, torch::kFloat64, torch::kBFloat16, torch::kFloat16};
  const Backend backends[] = {Backend::Reference, Backend::SDPA, Backend::Auto};
  // Heads of their own size (the head_dim option) from a generator of their own, so that
  // the other draws stay those of the configurations before it.
  std::mt19937 own(7);
  std::vector<ModernConfig> out;
  for (int i = 0; i < 360; ++i) {
    ModernConfig c{};
    c.index = i;
    c.B = pick(1, 3);
    c.C = pick(2, 24);
    c.T = pick(0, 2) == 0 ? c.C : pick(1, c.C);
    c.d_in = pick(1, 10);
    c.kv_heads = pick(1, 3);
    c.heads = c.kv_heads * pick(1, 3);
    c.head_dim = 2 * pick(1, 4);
    c.causal = pick(0, 4) != 0;
    c.qkv_bias = pick(0, 1) == 1;
    c.out_bias = pick(0, 1) == 1;
    if (c.causal && pick(0, 2) == 0) c.window = pick(1, 6);
    if (pick(0, 3) != 0) {
      RoPEOptions rope(std::pow(10.0, static_cast<double>(pick(2, 6))));
      rope.interleaved(pick(0, 2) == 0);
      if (pick(0, 2) == 0) rope.rotary_dim(2 * pick(1, c.head_dim / 2));
      c.rope = rope;
    }
    c.dtype = dtypes[i % 4];
    c.backend = backends[i / 4 % 3];
    c.cache = c.causal && pick(0, 2) == 0;
    c.padding = pick(0, 2) == 0;
    c.static_cache = c.cache && pick(0, 1) == 1;
    c.mask_buffer = pick(0, 1) == 1;
    if (std::uniform_int_distribution<int>(0, 2)(own) == 0) c.d_out = std::uniform_int_distribution<int64_t>(1, 12)(own);
    c.qk_norm = std::uniform_int_distribution<int>(0, 3)(own) % 3;  // none half the time
    // ALiBi where it applies: causal, no RoPE.
    c.alibi = std::uniform_int_distribution<int>(0, 2)(own) == 0 && c.causal && !c.rope;
    if (std::uniform_int_distribution<int>(0, 3)(own) == 0) c.softcap = 0.5 + std::uniform_int_distribution<int>(0, 4)(own);
    c.sinks = std::uniform_int_distribution<int>(0, 3)(own) == 0;
    out.push_back(c);
  }
  const size_t n = out.size();
  for (const auto& device : devices::all()) {
    if (device.is_cpu()) continue;
    for (size_t i = 0; i < n; ++i) {
      ModernConfig c = out[i];
      c.device = device;
      out.push_back(c);
    }
  }
  return out;
}

torchattn::MultiHeadAttentionOptions options_of(const ModernConfig& c) {
  auto o = torchattn::MultiHeadAttentionOptions(c.d_in, c.d_out > 0 ? c.d_out : c.heads * c.head_dim, c.C, c.heads)
               .num_kv_heads(c.kv_heads)
               .causal(c.causal)
               .qkv_bias(c.qkv_bias)
               .out_bias(c.out_bias)
               .backend(c.backend)
               .mask_buffer(c.mask_buffer);
  o.window(c.window);
  o.rope(c.rope);
  if (c.d_out > 0) o.head_dim(c.head_dim);
  if (c.qk_norm > 0) o.qk_norm(torchattn::QKNormOptions().eps(1e-5).per_head(c.qk_norm == 1));
  o.alibi(c.alibi);
  if (c.softcap > 0) o.softcap(c.softcap);
  o.sinks(c.sinks);
  return o;
}

// RoPE written out as transformers does: cos and sin in float32, then
// x * cos + rotate(x) * sin over the rotated features, in float64.
torch::Tensor rotate(const torch::Tensor& x /*[B, H, T, hd] f64*/, const torch::Tensor& pos /*[B, T] i64*/,
                     const RoPEOptions& rope) {
  const int64_t hd = x.size(-1), rot = rope.rotary_dim().value_or(hd);
  const auto inv_freq =
      1.0 / torch::pow(rope.theta(), torch::arange(0, rot, 2, torch::kFloat32) / static_cast<double>(rot));
  const auto angle = pos.to(torch::kFloat32).unsqueeze(-1) * inv_freq;  // [B, T, rot/2], float32
  auto c = angle.cos().to(torch::kFloat64).unsqueeze(1), s = angle.sin().to(torch::kFloat64).unsqueeze(1);
  auto xr = x.narrow(-1, 0, rot);
  torch::Tensor turned;
  if (rope.interleaved()) {  // GPT-J: pairs (0,1), (2,3), ...: rotate_every_two
    c = c.repeat_interleave(2, -1);
    s = s.repeat_interleave(2, -1);
    auto x1 = xr.slice(-1, 0, rot, 2), x2 = xr.slice(-1, 1, rot, 2);
    turned = xr * c + torch::stack({-x2, x1}, -1).flatten(-2) * s;
  } else {  // Llama: rotate_half
    c = torch::cat({c, c}, -1);
    s = torch::cat({s, s}, -1);
    auto x1 = xr.narrow(-1, 0, rot / 2), x2 = xr.narrow(-1, rot / 2, rot / 2);
    turned = xr * c + torch::cat({-x2, x1}, -1) * s;
  }
  return rot == hd ? turned : torch::cat({turned, x.narrow(-1, rot, hd - rot)}, -1);
}

// ALiBi's slopes as BLOOM's build_alibi_tensor computes them (float32 powers of a
// float32 base), written out apart from the library's.
torch::Tensor bloom_slopes(int64_t heads) {
  const int64_t n = int64_t{1} << static_cast<int64_t>(std::floor(std::log2(static_cast<double>(heads))));
  auto base = [](double m) { return std::pow(2.0, -std::pow(2.0, -(std::log2(m) - 3.0))); };
  auto slopes = torch::pow(torch::tensor(base(n), torch::kFloat32), torch::arange(1, 1 + n, torch::kInt32));
  if (n != heads) {
    const int64_t left = std::min(n, heads - n);
    slopes = torch::cat({slopes, torch::pow(torch::tensor(base(2 * n), torch::kFloat32),
                                            torch::arange(1, 1 + 2 * left, 2, torch::kInt32))});
  }
  return slopes;
}

// The whole layer in float64 from the module's weights.
torch::Tensor reference(const ModernConfig& c, torchattn::MultiHeadAttentionImpl& m, const torch::Tensor& x /*f64*/,
                        const torch::Tensor& pad /*[B,T] bool or undefined*/) {
  auto w = [&](const torch::nn::Linear& l, const torch::Tensor& in) {
    auto y = in.matmul(l->weight.detach().cpu().to(torch::kFloat64).t());
    return l->bias.defined() ? y + l->bias.detach().cpu().to(torch::kFloat64) : y;
  };
  const int64_t B = c.B, T = c.T, H = c.heads, Hkv = c.kv_heads, hd = c.head_dim;
  // QK-norm as transformers' RMSNorm computes it: in float32, back to float64, times
  // the weight; over each head's features or over all of a token's.
  auto rms = [&](const torch::Tensor& t, const RMSNorm& n) {
    const auto h = t.to(torch::kFloat32);
    const auto normed = (h * torch::rsqrt(h.pow(2).mean(-1, true) + n->eps)).to(torch::kFloat64);
    return n->weight.detach().cpu().to(torch::kFloat64) * normed;
  };
  auto q = w(m.W_query, x), k = w(m.W_key, x);
  if (c.qk_norm == 2) {
    q = rms(q, m.q_norm);
    k = rms(k, m.k_norm);
  }
  q = q.view({B, T, H, hd});
  k = k.view({B, T, Hkv, hd});
  if (c.qk_norm == 1) {
    q = rms(q, m.q_norm);
    k = rms(k, m.k_norm);
  }
  q = q.transpose(1, 2);
  k = k.transpose(1, 2);
  auto v = w(m.W_value, x).view({B, T, Hkv, hd}).transpose(1, 2);
  const auto keep = pad.defined() ? pad.logical_not() : torch::ones({B, T}, torch::kBool);
  if (c.rope) {
    const auto pos = (keep.to(torch::kLong).cumsum(-1) - 1).clamp_min(0);  // real tokens before each
    q = rotate(q, pos, *c.rope);
    k = rotate(k, pos, *c.rope);
  }
  k = k.repeat_interleave(H / Hkv, 1);
  v = v.repeat_interleave(H / Hkv, 1);
  auto hide = keep.logical_not().view({B, 1, 1, T}).expand({B, 1, T, T});
  const auto i = torch::arange(T).unsqueeze(1), j = torch::arange(T).unsqueeze(0);
  if (c.causal) hide = hide | (j > i);
  if (c.window) hide = hide | (j <= i - *c.window);
  auto scores = q.matmul(k.transpose(2, 3)) / std::sqrt(static_cast<double>(hd));
  if (c.softcap > 0) scores = torch::tanh(scores / c.softcap) * c.softcap;
  if (c.alibi) {  // slope * (key position - query position), positions counting real tokens
    const auto pos = (keep.to(torch::kLong).cumsum(-1) - 1).to(torch::kFloat64);  // [B, T]
    const auto distance = pos.unsqueeze(1) - pos.unsqueeze(2);                    // [B, Tq, Tk]
    scores = scores + bloom_slopes(H).to(torch::kFloat64).view({1, H, 1, 1}) * distance.unsqueeze(1);
  }
  scores = scores.masked_fill(hide, -std::numeric_limits<double>::infinity());
  torch::Tensor weights;
  if (c.sinks) {  // a column of the head's sink logit joins the softmax, then goes
    const auto sink = m.sinks.detach().cpu().to(torch::kFloat64).view({1, H, 1, 1}).expand({B, H, T, 1});
    weights = torch::softmax(torch::cat({scores, sink}, -1), -1).narrow(-1, 0, T);
  } else {
    weights = torch::softmax(scores, -1);
  }
  weights = weights.masked_fill(hide.all(-1, true), 0.0);
  return w(m.out_proj, weights.matmul(v).transpose(1, 2).reshape({B, T, H * hd}));
}

class Modern : public ::testing::TestWithParam<ModernConfig> {
 protected:
  void SetUp() override { devices::skip_unless_present(GetParam().device); }
};

TEST_P(Modern, MatchesTheLayerWrittenOutInFloat64) {
  const ModernConfig c = GetParam();
  SCOPED_TRACE(describe_modern(c));
  torch::manual_seed(c.index);
  torchattn::MultiHeadAttention m(options_of(c));
  if (c.qk_norm > 0) {  // weights of ones at first: make them count
    torch::NoGradGuard no_grad;
    m->q_norm->weight.uniform_(0.5, 1.5);
    m->k_norm->weight.uniform_(0.5, 1.5);
  }
  if (c.sinks) {  // zeros at first
    torch::NoGradGuard no_grad;
    m->sinks.uniform_(-2.0, 2.0);
  }
  m->to(c.dtype);
  m->eval();
  const auto x = torch::randn({c.B, c.T, c.d_in}, torch::kFloat64).to(c.dtype);  // rounded once
  torch::Tensor pad;
  if (c.padding) {
    // Left padding (the generation case) or scattered: each sequence keeps its last token.
    pad = c.index % 2 == 0 ? torch::arange(c.T).unsqueeze(0) < torch::randint(0, c.T, {c.B, 1})
                           : torch::rand({c.B, c.T}) < 0.3;
    pad.select(1, c.T - 1).fill_(false);
  }
  const auto expected = reference(c, *m, x.to(torch::kFloat64), pad);
  m->to(c.device);
  const auto on = [&](const torch::Tensor& t) { return t.defined() ? t.to(c.device) : t; };

  torch::NoGradGuard no_grad;
  torch::Tensor y;
  if (c.cache) {
    auto cache = m->make_kv_cache(c.B, c.static_cache);
    EXPECT_EQ(cache.key_storage().size(1), c.kv_heads);
    const int64_t first = std::max<int64_t>(1, c.T / 2);
    std::vector<torch::Tensor> parts{m->forward_cached(on(x.narrow(1, 0, first)), cache,
                                                       pad.defined() ? on(pad.narrow(1, 0, first)) : pad)};
    for (int64_t t = first; t < c.T; ++t) {
      parts.push_back(m->forward_cached(on(x.narrow(1, t, 1)), cache, pad.defined() ? on(pad.narrow(1, t, 1)) : pad));
    }
    y = torch::cat(parts, 1);
  } else {
    y = m(on(x), on(pad));
  }
  y = y.cpu();
  ASSERT_FALSE(y.isnan().any().item<bool>());
  // Rows of padding tokens see only padding in a causal layer: compare the real ones.
  const auto rows = pad.defined() ? pad.logical_not() : torch::ones({c.B, c.T}, torch::kBool);
  const auto got = y.index({rows}).to(torch::kFloat64), want = expected.index({rows});
  if (c.dtype == torch::kFloat32 || c.dtype == torch::kFloat64) {
    EXPECT_TRUE(tol::close(got, want, tol::for_dtype(c.dtype)));
  } else {
    // Half precision: within the rounding of its inputs, weights and output.
    const double eps = c.dtype == torch::kBFloat16 ? 7.8e-3 : 9.8e-4;
    EXPECT_LE((got - want).abs().max().item<double>(), 20 * eps * (want.abs().max().item<double>() + 1));
  }
}

INSTANTIATE_TEST_SUITE_P(Random, Modern, ::testing::ValuesIn(modern_configs()),
                         [](const ::testing::TestParamInfo<ModernConfig>& info) {
                           return devices::prefix(info.param.device) + "n" + std::to_string(info.param.index);
                         });

// Gradients flow through every new option; in training with dropout every backend runs.
TEST(ModernAttention, GradientsAndDropoutInTraining) {
  for (const auto backend : {Backend::Reference, Backend::SDPA, Backend::Auto}) {
    torch::manual_seed(5);
    torchattn::MultiHeadAttention m(torchattn::MultiHeadAttentionOptions(12, 12, 16, 6)
                                        .num_kv_heads(2)
                                        .rope(RoPEOptions(500000.0).rotary_dim(2))
                                        .window(4)
                                        .dropout(0.2)
                                        .out_bias(false)
                                        .backend(backend));
    m->to(torch::kFloat64);
    auto x = torch::randn({2, 16, 12}, torch::kFloat64).requires_grad_(true);
    auto pad = torch::zeros({2, 16}, torch::kBool);
    pad.narrow(1, 0, 3)[0].fill_(true);
    m(x, pad).sum().backward();
    EXPECT_TRUE(torch::isfinite(x.grad()).all().item<bool>()) << backend;
    for (auto& p : m->parameters()) EXPECT_TRUE(torch::isfinite(p.grad()).all().item<bool>()) << backend;
    // Eval: no dropout, and central differences for the input gradient.
    m->eval();
    auto xs = torch::randn({1, 5, 12}, torch::kFloat64).requires_grad_(true);
    const auto g = torch::randn({1, 5, 12}, torch::kFloat64);
    (m(xs) * g).sum().backward();
    torch::NoGradGuard no_grad;
    const double h = 1e-6;
    for (int64_t i = 0; i < xs.numel(); i += 7) {
      auto up = xs.detach().clone(), down = xs.detach().clone();
      up.view(-1)[i] += h;
      down.view(-1)[i] -= h;
      const double numeric = ((m(up) * g).sum().item<double>() - (m(down) * g).sum().item<double>()) / (2 * h);
      EXPECT_NEAR(xs.grad().view(-1)[i].item<double>(), numeric, 1e-6) << backend << " element " << i;
    }
  }
}

TEST(ModernAttention, DefaultsAreTheNotebooks) {
  torch::manual_seed(3);
  torchattn::MultiHeadAttention plain(torchattn::MultiHeadAttentionOptions(6, 6, 8, 3));
  torch::manual_seed(3);
  torchattn::MultiHeadAttention spelled(torchattn::MultiHeadAttentionOptions(6, 6, 8, 3)
                                            .num_kv_heads(3)
                                            .causal(true)
                                            .out_bias(true)
                                            .window(std::nullopt)
                                            .rope(std::nullopt));
  auto x = torch::randn({2, 8, 6});
  EXPECT_TRUE(torch::equal(plain(x), spelled(x)));
  std::vector<std::string> keys;
  for (const auto& p : plain->named_parameters()) keys.push_back(p.key());
  for (const auto& b : plain->named_buffers()) keys.push_back(b.key());
  EXPECT_EQ(keys, (std::vector<std::string>{"W_query.weight", "W_key.weight", "W_value.weight", "out_proj.weight",
                                            "out_proj.bias", "mask"}));
}

TEST(ModernAttention, StateDictKeysOfLlamaAndBertStyles) {
  torchattn::MultiHeadAttention llama(
      torchattn::MultiHeadAttentionOptions(48, 48, 64, 6).num_kv_heads(2).rope(RoPEOptions(1e5)).out_bias(false));
  EXPECT_EQ(llama->W_key->weight.sizes(), (std::vector<int64_t>{16, 48}));  // 2 heads of 8
  EXPECT_EQ(llama->W_value->weight.sizes(), (std::vector<int64_t>{16, 48}));
  EXPECT_FALSE(llama->out_proj->bias.defined());
  EXPECT_TRUE(llama->named_buffers().contains("mask"));
  torchattn::MultiHeadAttention bert(torchattn::MultiHeadAttentionOptions(48, 48, 64, 6).causal(false).qkv_bias(true));
  EXPECT_FALSE(bert->named_buffers().contains("mask"));  // nothing to mask
  EXPECT_TRUE(bert->W_key->bias.defined());
  std::ostringstream s;
  llama->pretty_print(s);
  EXPECT_EQ(s.str(),
            "torchattn::MultiHeadAttention(d_in=48, d_out=48, context_length=64, num_heads=6, dropout=0, qkv_bias=false, "
            "backend=auto, num_kv_heads=2, out_bias=false, rope=(theta=100000, interleaved=false))");
  std::ostringstream t;
  bert->pretty_print(t);
  EXPECT_EQ(t.str(),
            "torchattn::MultiHeadAttention(d_in=48, d_out=48, context_length=64, num_heads=6, dropout=0, qkv_bias=true, "
            "backend=auto, causal=false)");
}

// head_dim of its own (Qwen3, Gemma 2): W_query gives num_heads * head_dim features,
// out_proj maps them back to d_out; caches hold head_dim features per head; the paged
// path gives forward's rows; the same head_dim as d_out / num_heads changes nothing.
TEST(ModernAttention, HeadDimOfItsOwn) {
  torch::manual_seed(3);
  const auto options = torchattn::MultiHeadAttentionOptions(24, 20, 16, 4).num_kv_heads(2).head_dim(8)
                           .rope(RoPEOptions(1e4)).out_bias(false);
  torchattn::MultiHeadAttention m(options);
  m->eval();
  EXPECT_EQ(m->head_dim(), 8);
  EXPECT_EQ(m->W_query->weight.sizes(), (std::vector<int64_t>{32, 24}));
  EXPECT_EQ(m->W_key->weight.sizes(), (std::vector<int64_t>{16, 24}));
  EXPECT_EQ(m->out_proj->weight.sizes(), (std::vector<int64_t>{20, 32}));
  EXPECT_EQ(m->make_kv_cache(1).key_storage().sizes(), (std::vector<int64_t>{1, 2, 16, 8}));
  std::ostringstream s;
  m->pretty_print(s);
  EXPECT_NE(s.str().find(", num_kv_heads=2, head_dim=8,"), std::string::npos) << s.str();
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({1, 11, 24});
  const auto y = m(x);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{1, 11, 20}));
  auto cache = m->make_kv_cache(1);
  const auto cached = torch::cat({m->forward_cached(x.narrow(1, 0, 7), cache), m->forward_cached(x.narrow(1, 7, 4), cache)}, 1);
  EXPECT_TRUE(torch::allclose(cached, y, 1e-5, 1e-6));
  auto paged = m->make_paged_kv_cache(torchattn::PagedKVCacheOptions(8).block_size(4));
  const int64_t seq = paged.add_sequence();
  auto first = paged.begin_step({{seq, 7}});
  const auto a = m->forward_paged(x[0].narrow(0, 0, 7), paged, first);
  auto second = paged.begin_step({{seq, 4}});
  const auto b = m->forward_paged(x[0].narrow(0, 7, 4), paged, second);
  EXPECT_TRUE(torch::allclose(torch::cat({a, b}), y[0], 1e-5, 1e-6));
  // head_dim given equal to d_out / num_heads: the same module, the same numbers.
  torch::manual_seed(4);
  torchattn::MultiHeadAttention implied(torchattn::MultiHeadAttentionOptions(24, 32, 16, 4));
  torch::manual_seed(4);
  torchattn::MultiHeadAttention given(torchattn::MultiHeadAttentionOptions(24, 32, 16, 4).head_dim(8));
  EXPECT_TRUE(torch::equal(implied(x), given(x)));
}

// Softcapping and sinks take the blocked path: its gradients (each block recomputed in
// backward) against autograd through the layer written out; and a sequence long enough
// for several blocks against the whole-matrix math.
namespace {
torch::Tensor softcap_sinks_layer(const torch::Tensor& x, const torch::Tensor& wq, const torch::Tensor& wk,
                                  const torch::Tensor& wv, const torch::Tensor& wo, const torch::Tensor& bo,
                                  const torch::Tensor& sinks, int64_t H, int64_t Hkv, double cap) {
  const int64_t B = x.size(0), T = x.size(1), hd = wq.size(0) / H;
  auto q = x.matmul(wq.t()).view({B, T, H, hd}).transpose(1, 2);
  auto k = x.matmul(wk.t()).view({B, T, Hkv, hd}).transpose(1, 2).repeat_interleave(H / Hkv, 1);
  auto v = x.matmul(wv.t()).view({B, T, Hkv, hd}).transpose(1, 2).repeat_interleave(H / Hkv, 1);
  auto s = q.matmul(k.transpose(2, 3)) / std::sqrt(static_cast<double>(hd));
  s = torch::tanh(s / cap) * cap;
  s = s.masked_fill(torch::ones({T, T}, torch::kBool).triu(1), -std::numeric_limits<double>::infinity());
  auto p = torch::softmax(torch::cat({s, sinks.view({1, H, 1, 1}).expand({B, H, T, 1})}, -1), -1).narrow(-1, 0, T);
  return p.matmul(v).transpose(1, 2).reshape({B, T, H * hd}).matmul(wo.t()) + bo;
}
}  // namespace

// Cross-attention with keys and values of widths of their own (kdim, vdim), a padded
// context, grouped heads and QK-norm, against the math in float64; the cross cache
// (cross_kv once, then a token at a time) gives the rows of the whole forward.
TEST(ModernAttention, CrossAttentionIsTheMathOverItsContext) {
  torch::manual_seed(61);
  const int64_t B = 2, T = 4, S = 6, d_in = 8, kdim = 6, vdim = 5, H = 4, Hkv = 2, hd = 3;
  torchattn::MultiHeadAttention m(torchattn::MultiHeadAttentionOptions(d_in, 10, 16, H)
                                      .num_kv_heads(Hkv)
                                      .head_dim(hd)
                                      .kdim(kdim)
                                      .vdim(vdim)
                                      .causal(false)
                                      .qkv_bias(true)
                                      .qk_norm(torchattn::QKNormOptions()));
  EXPECT_EQ(m->W_key->weight.sizes(), (std::vector<int64_t>{Hkv * hd, kdim}));
  EXPECT_EQ(m->W_value->weight.sizes(), (std::vector<int64_t>{Hkv * hd, vdim}));
  m->q_norm->weight.data().uniform_(0.5, 1.5);
  m->k_norm->weight.data().uniform_(0.5, 1.5);
  m->to(torch::kFloat64);
  const auto x = torch::randn({B, T, d_in}, torch::kFloat64), kc = torch::randn({B, S, kdim}, torch::kFloat64);
  const auto vc = torch::randn({B, S, vdim}, torch::kFloat64);
  auto pad = torch::zeros({B, S}, torch::kBool);
  pad[1].narrow(0, 4, 2).fill_(true);
  auto lin = [](const torch::nn::Linear& l, const torch::Tensor& in) { return in.matmul(l->weight.t()) + l->bias; };
  auto rms = [](const torch::Tensor& t, const torchattn::RMSNorm& n) {
    const auto h = t.to(torch::kFloat32);
    return n->weight * (h * torch::rsqrt(h.pow(2).mean(-1, true) + n->eps)).to(torch::kFloat64);
  };
  torch::Tensor want;
  {
    torch::NoGradGuard no_grad;
    const auto q = rms(lin(m->W_query, x).view({B, T, H, hd}), m->q_norm).transpose(1, 2);
    const auto k = rms(lin(m->W_key, kc).view({B, S, Hkv, hd}), m->k_norm).transpose(1, 2).repeat_interleave(2, 1);
    const auto v = lin(m->W_value, vc).view({B, S, Hkv, hd}).transpose(1, 2).repeat_interleave(2, 1);
    auto scores = q.matmul(k.transpose(2, 3)) / std::sqrt(static_cast<double>(hd));
    scores = scores.masked_fill(pad.view({B, 1, 1, S}), -INFINITY);
    want = lin(m->out_proj, torch::softmax(scores, -1).matmul(v).transpose(1, 2).reshape({B, T, H * hd}));
  }
  const auto kv = m->cross_kv(kc, pad, vc);
  EXPECT_EQ(kv.keys.sizes(), (std::vector<int64_t>{B, Hkv, S, hd}));
  const auto y = m->forward_cross(x, kv);
  EXPECT_LT((y - want).abs().max().item<double>(), 1e-12);
  torch::NoGradGuard no_grad;
  for (int64_t t = 0; t < T; ++t) {  // the cross cache, a token at a time
    EXPECT_LT((m->forward_cross(x.narrow(1, t, 1), kv) - want.narrow(1, t, 1)).abs().max().item<double>(), 1e-12);
  }
  // Unbatched: [T, d_in] over [S, kdim].
  const auto one = m->forward_cross(x[0], m->cross_kv(kc[0], pad[0], vc[0]));
  EXPECT_LT((one - want[0]).abs().max().item<double>(), 1e-12);
}

TEST(ModernAttention, SoftcapAndSinksGradientsAreTheMath) {
  for (const auto& [T, dtype] : std::vector<std::pair<int64_t, torch::Dtype>>{{9, torch::kFloat64},
                                                                              {1100, torch::kFloat32}}) {
    SCOPED_TRACE("T=" + std::to_string(T));
    torch::manual_seed(11);
    const int64_t H = T > 100 ? 2 : 4, Hkv = T > 100 ? 1 : 2;
    torchattn::MultiHeadAttention m(
        torchattn::MultiHeadAttentionOptions(12, 16, T, H).num_kv_heads(Hkv).softcap(2.0).sinks(true).mask_buffer(false));
    m->to(dtype);
    {
      torch::NoGradGuard no_grad;
      m->sinks.uniform_(-1.0, 1.0);
    }
    const auto x = torch::randn({1, T, 12}, dtype).requires_grad_(true);
    const auto g = torch::randn({1, T, 16}, dtype);
    (m(x) * g).sum().backward();  // two blocks at T = 1100 (2 heads x 1100 keys a row)
    auto leaf = [&](const torch::Tensor& t) { return t.detach().to(torch::kFloat64).requires_grad_(true); };
    const auto x2 = leaf(x), wq = leaf(m->W_query->weight), wk = leaf(m->W_key->weight), wv = leaf(m->W_value->weight),
               wo = leaf(m->out_proj->weight), bo = leaf(m->out_proj->bias), s2 = leaf(m->sinks);
    (softcap_sinks_layer(x2, wq, wk, wv, wo, bo, s2, H, Hkv, 2.0) * g.to(torch::kFloat64)).sum().backward();
    const double tol = dtype == torch::kFloat64 ? 1e-10 : 2e-4;
    auto close = [&](const torch::Tensor& a, const torch::Tensor& b, const char* what) {
      const double err = (a.to(torch::kFloat64) - b).abs().max().item<double>() / (b.abs().max().item<double>() + 1e-30);
      EXPECT_LT(err, tol) << what;
    };
    close(x.grad(), x2.grad(), "grad of x");
    close(m->W_query->weight.grad(), wq.grad(), "grad of W_query");
    close(m->W_key->weight.grad(), wk.grad(), "grad of W_key");
    close(m->W_value->weight.grad(), wv.grad(), "grad of W_value");
    close(m->out_proj->weight.grad(), wo.grad(), "grad of out_proj");
    close(m->sinks.grad(), s2.grad(), "grad of sinks");
  }
}

// The point of GQA: a cache num_heads / num_kv_heads times smaller.
TEST(ModernAttention, GroupedCachesAreSmallerByTheGroupFactor) {
  torchattn::MultiHeadAttention mha(torchattn::MultiHeadAttentionOptions(64, 64, 128, 8));
  torchattn::MultiHeadAttention gqa(torchattn::MultiHeadAttentionOptions(64, 64, 128, 8).num_kv_heads(2));
  auto a = mha->make_kv_cache(2), b = gqa->make_kv_cache(2);
  EXPECT_EQ(a.key_storage().numel(), 4 * b.key_storage().numel());
  EXPECT_EQ(b.key_storage().sizes(), (std::vector<int64_t>{2, 2, 128, 8}));
}

// QK-norm (Qwen3, OLMo 2): q_norm and k_norm named as transformers names them, of
// head_dim (per head) or of all the heads' features; recorded in checkpoints; a bad eps
// is an error naming it.
TEST(ModernAttention, QKNormWeightsAndOptions) {
  const auto base = torchattn::MultiHeadAttentionOptions(16, 16, 12, 4).num_kv_heads(2).head_dim(8);
  torchattn::MultiHeadAttention per_head(torchattn::MultiHeadAttentionOptions(base).qk_norm(torchattn::QKNormOptions()));
  const auto params = per_head->named_parameters();
  ASSERT_TRUE(params.contains("q_norm.weight") && params.contains("k_norm.weight"));
  EXPECT_EQ(params["q_norm.weight"].sizes(), (std::vector<int64_t>{8}));
  EXPECT_EQ(params["k_norm.weight"].sizes(), (std::vector<int64_t>{8}));
  EXPECT_TRUE(torch::equal(params["q_norm.weight"], torch::ones({8})));
  torchattn::MultiHeadAttention all_heads(
      torchattn::MultiHeadAttentionOptions(base).qk_norm(torchattn::QKNormOptions().per_head(false).eps(1e-5)));
  EXPECT_EQ(all_heads->q_norm->weight.sizes(), (std::vector<int64_t>{32}));
  EXPECT_EQ(all_heads->k_norm->weight.sizes(), (std::vector<int64_t>{16}));
  std::ostringstream s;
  all_heads->pretty_print(s);
  EXPECT_NE(s.str().find(", qk_norm=(eps=1e-05, per_head=false)"), std::string::npos) << s.str();
  EXPECT_FALSE(torchattn::MultiHeadAttention(base)->named_parameters().contains("q_norm.weight"));
  EXPECT_EQ(error_of([&] { torchattn::MultiHeadAttention(torchattn::MultiHeadAttentionOptions(base).qk_norm(
                               torchattn::QKNormOptions().eps(0.0))); }),
            "MultiHeadAttention: expected qk_norm eps > 0, got 0");
  // Saved with per-head norms: another eps, or none, is named.
  const auto path = temp_path("qk_norm.pt");
  torch::save(per_head, path);
  torchattn::MultiHeadAttention other_eps(
      torchattn::MultiHeadAttentionOptions(base).qk_norm(torchattn::QKNormOptions().eps(1e-5)));
  EXPECT_NE(error_of([&] { torch::load(other_eps, path); }).find("saved with qk_norm_eps=9.9999999999999995e-07, this module has qk_norm_eps=1.0000000000000001e-05"),
            std::string::npos) << error_of([&] { torch::load(other_eps, path); });
  torchattn::MultiHeadAttention none(base);
  EXPECT_NE(error_of([&] { torch::load(none, path); }).find("saved with qk_norm=per_head, this module has qk_norm=none"),
            std::string::npos) << error_of([&] { torch::load(none, path); });
  torchattn::MultiHeadAttention same(torchattn::MultiHeadAttentionOptions(base).qk_norm(torchattn::QKNormOptions()));
  torch::load(same, path);
}

// Each new option is recorded and checked; W_key of the wrong number of kv heads (or
// of another context width) is named with the option that explains its shape.
TEST(ModernAttention, CheckpointsRecordTheNewOptions) {
  const auto path = temp_path("modern_options.pt");
  const auto base = torchattn::MultiHeadAttentionOptions(16, 16, 12, 4).num_kv_heads(2).rope(RoPEOptions(1e4)).window(4);
  torch::save(torchattn::MultiHeadAttention(base), path);
  torchattn::MultiHeadAttention same(base);
  torch::load(same, path);
  struct Case {
    torchattn::MultiHeadAttentionOptions options;
    std::string message;
  };
  const std::vector<Case> cases{
      {torchattn::MultiHeadAttentionOptions(base).window(6), "saved with window=4, this module has window=6"},
      {torchattn::MultiHeadAttentionOptions(base).window(std::nullopt), "saved with window=4, this module has window=none"},
      {torchattn::MultiHeadAttentionOptions(base).rope(RoPEOptions(1e5)),
       "saved with rope_theta=10000, this module has rope_theta=100000"},
      {torchattn::MultiHeadAttentionOptions(base).rope(RoPEOptions(1e4).interleaved(true)),
       "saved with rope_interleaved=false, this module has rope_interleaved=true"},
      {torchattn::MultiHeadAttentionOptions(base).rope(RoPEOptions(1e4).rotary_dim(2)),
       "saved with rope_rotary_dim=none, this module has rope_rotary_dim=2"},
      {torchattn::MultiHeadAttentionOptions(base).rope(std::nullopt), "saved with rope_theta=10000, this module has rope_theta=none"},
      {torchattn::MultiHeadAttentionOptions(base).window(std::nullopt).causal(false),
       "saved with causal=true, this module has causal=false"},
      {torchattn::MultiHeadAttentionOptions(base).head_dim(8), "saved with head_dim=4, this module has head_dim=8"},
  };
  for (const auto& c : cases) {
    torchattn::MultiHeadAttention m(c.options);
    EXPECT_NE(error_of([&] { torch::load(m, path); }).find("MultiHeadAttention: checkpoint of the module was " + c.message),
              std::string::npos)
        << c.message << "\n got: " << error_of([&] { torch::load(m, path); });
  }
  // Cross-attention's context widths: recorded as the widths W_key and W_value read
  // (d_in where unset, so an explicit kdim equal to d_in loads a file saved without one).
  const auto cross = torchattn::MultiHeadAttentionOptions(16, 16, 12, 4).causal(false).kdim(12).vdim(8);
  torch::save(torchattn::MultiHeadAttention(cross), path);
  torchattn::MultiHeadAttention cross_kdim10(torchattn::MultiHeadAttentionOptions(cross).kdim(10));
  EXPECT_EQ(error_of([&] { torch::load(cross_kdim10, path); }),
            "MultiHeadAttention: checkpoint of the module was saved with kdim=12, this module has kdim=10 (the tensors' "
            "shapes differ with it)");
  torchattn::MultiHeadAttention cross_vdim(torchattn::MultiHeadAttentionOptions(cross).vdim(std::nullopt));
  EXPECT_EQ(error_of([&] { torch::load(cross_vdim, path); }),
            "MultiHeadAttention: checkpoint of the module was saved with vdim=8, this module has vdim=16 (the tensors' "
            "shapes differ with it)");
  torch::save(torchattn::MultiHeadAttention(torchattn::MultiHeadAttentionOptions(16, 16, 12, 4).causal(false)), path);
  torchattn::MultiHeadAttention explicit_width(torchattn::MultiHeadAttentionOptions(16, 16, 12, 4).causal(false).kdim(16));
  torch::load(explicit_width, path);
  torch::save(torchattn::MultiHeadAttention(base), path);
  // num_kv_heads changes W_key's shape: the recorded option names it first, and a file
  // without options (LibTorch's own Module::save; a Python state dict) explains the shape.
  torchattn::MultiHeadAttention one_kv_head(torchattn::MultiHeadAttentionOptions(base).num_kv_heads(1));
  EXPECT_NE(error_of([&] { torch::load(one_kv_head, path); })
                .find("MultiHeadAttention: checkpoint of the module was saved with num_kv_heads=2, this module has "
                      "num_kv_heads=1"),
            std::string::npos);
  torch::serialize::OutputArchive archive;
  torchattn::MultiHeadAttention(base)->torch::nn::Module::save(archive);
  archive.save_to(path);
  EXPECT_EQ(error_of([&] { torch::load(one_kv_head, path); }),
            "MultiHeadAttention: checkpoint key 'W_key.weight' has shape [8, 16], expected [4, 16] (W_key projects to "
            "num_kv_heads * head_dim = 1 * 4 features)");
  torchattn::save_state_dict(*torchattn::MultiHeadAttention(base), path);  // a Python-style dict: no options
  EXPECT_EQ(error_of([&] { torchattn::load_state_dict(*one_kv_head, path); }),
            "load_state_dict: key 'W_key.weight' has shape [8, 16] in '" + path +
                "', expected [4, 16] (W_key projects to num_kv_heads * head_dim = 1 * 4 features)");
  std::filesystem::remove(path);
}

// Left-padded prompts with RoPE: positions count each sequence's real tokens, so every
// sequence decodes as it would alone (what transformers' generate does).
TEST(ModernAttention, RotaryPositionsSkipLeftPadding) {
  torch::manual_seed(8);
  torchattn::MultiHeadAttention m(
      torchattn::MultiHeadAttentionOptions(8, 8, 16, 4).num_kv_heads(2).rope(RoPEOptions(1e4)).out_bias(false));
  m->eval();
  torch::NoGradGuard no_grad;
  auto alone = torch::randn({1, 6, 8});
  auto padded = torch::cat({torch::randn({1, 3, 8}), alone.narrow(1, 0, 4)}, 1);  // 3 padding tokens
  auto pad = torch::tensor({{true, true, true, false, false, false, false}});
  auto cache = m->make_kv_cache(1);
  auto first = m->forward_cached(padded, cache, pad);
  auto next = m->forward_cached(alone.narrow(1, 4, 2), cache);
  auto expected = m(alone);
  EXPECT_TRUE(tol::close(first.narrow(1, 3, 4), expected.narrow(1, 0, 4)));
  EXPECT_TRUE(tol::close(next, expected.narrow(1, 4, 2)));
  // And a forward with the same mask agrees with the cache.
  EXPECT_TRUE(tol::close(m(padded, pad).narrow(1, 3, 4), expected.narrow(1, 0, 4)));
}

// The tables are built once per device: a second forward does not recompute them,
// and functional::rotary_tables gives transformers' float32 values.
TEST(ModernAttention, RotaryTablesAreFloat32AndReused) {
  const auto [cos, sin] = torchattn::functional::rotary_tables(RoPEOptions(1e4), 8, 5);
  EXPECT_EQ(cos.scalar_type(), torch::kFloat32);
  EXPECT_EQ(cos.sizes(), (std::vector<int64_t>{5, 4}));
  const auto inv = 1.0 / torch::pow(1e4, torch::arange(0, 8, 2, torch::kFloat32) / 8.0);
  EXPECT_TRUE(torch::equal(cos, (torch::arange(5, torch::kFloat32).unsqueeze(1) * inv).cos()));
  EXPECT_TRUE(torch::equal(sin.select(0, 0), torch::zeros({4})));
}

// The tables a module uses on a device (detail::RotaryCache, the path forward takes)
// equal the CPU's bit for bit: they are computed on the CPU and moved, since CUDA's
// own pow, sin and cos differ by a few ULP (about 6e-8), far above the float64 tests'
// tolerances.
class RotaryTablesOn : public ::testing::TestWithParam<torch::Device> {
 protected:
  void SetUp() override { devices::skip_unless_present(GetParam()); }
};

TEST_P(RotaryTablesOn, EqualTheCpuTablesBitForBit) {
  const torch::Device device = GetParam();
  for (const double theta : {1e4, 5e5, 1e6}) {
    for (const int64_t rot : {int64_t{64}, int64_t{32}}) {
      SCOPED_TRACE("theta " + std::to_string(theta) + " rotary_dim " + std::to_string(rot));
      const auto rope = RoPEOptions(theta).rotary_dim(rot);
      const auto [cos_cpu, sin_cpu] = torchattn::functional::rotary_tables(rope, 64, 4096);
      const torchattn::detail::RotaryCache cache(rope, 64, 4096);
      const auto [cos, sin] = cache.tables(device);
      EXPECT_EQ(cos.device(), device);
      EXPECT_EQ(cos.scalar_type(), torch::kFloat32);
      EXPECT_TRUE(torch::equal(cos.cpu(), cos_cpu));
      EXPECT_TRUE(torch::equal(sin.cpu(), sin_cpu));
      // The second call returns the tables kept for the device.
      EXPECT_TRUE(cache.tables(device).first.is_same(cos));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, RotaryTablesOn, ::testing::ValuesIn(devices::all()),
                         [](const auto& info) { return devices::name(info); });

// The modules' one-pass CPU kernel gives the composite functional::apply_rotary's
// numbers to the bit, forward and backward, in every dtype, layout and position form.
TEST(ModernAttention, CpuRotaryKernelEqualsTheComposite) {
  for (const auto dtype : {torch::kFloat32, torch::kFloat64, torch::kBFloat16, torch::kFloat16}) {
    for (const bool interleaved : {false, true}) {
      for (const int64_t rot : {int64_t{8}, int64_t{4}}) {
        for (const bool per_sequence : {false, true}) {
          SCOPED_TRACE(std::string(c10::toString(dtype)) + (interleaved ? " interleaved" : "") + " rotary_dim " +
                       std::to_string(rot) + (per_sequence ? " [B, T] positions" : " [T] positions"));
          torch::manual_seed(9);
          const auto rope = RoPEOptions(1e4).interleaved(interleaved).rotary_dim(rot);
          const auto [cos, sin] = torchattn::functional::rotary_tables(rope, 8, 12);
          const auto pos = per_sequence ? torch::randint(0, 12, {2, 7}, torch::kLong) : torch::arange(3, 10);
          auto a = torch::randn({2, 7, 3, 8}).to(dtype).requires_grad_(true);  // [B, T, G, head_dim]
          auto b = a.detach().clone().requires_grad_(true);
          auto kernel = torchattn::kernels::cpu::rotary(a, pos, cos, sin, rope);
          auto composite = torchattn::functional::apply_rotary(b.transpose(1, 2), pos, cos, sin, rope).transpose(1, 2);
          EXPECT_TRUE(torch::equal(kernel, composite));
          const auto g = torch::randn({2, 7, 3, 8}).to(dtype);
          kernel.backward(g);
          composite.backward(g);
          EXPECT_TRUE(tol::close(a.grad(), b.grad(), tol::for_dtype(dtype)));
        }
      }
    }
  }
  const auto [cos, sin] = torchattn::functional::rotary_tables(RoPEOptions(), 8, 4);
  try {
    torchattn::kernels::cpu::rotary(torch::zeros({1, 2, 1, 8}), torch::tensor({1, 4}), cos, sin, RoPEOptions());
    ADD_FAILURE() << "a position past the tables was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("rotary: expected positions in [0, 4)"), std::string::npos);
  }
}

} // namespace

// MultiHeadAttention with the options of today's models (grouped-query heads, RoPE,
// sliding windows, non-causal encoders, out_proj without bias, QK-norm, ALiBi,
// softcapping, sinks, heads of their own size) against a float64 reference written out
// here, independently of the library: random configurations over every backend,
// dtype, padding, dynamic and static caches and the mask buffer, on every device
// present. Also: gradients and dropout, the defaults build what the notebooks build,
// the state dict's keys, QK-norm's weights and options, and eight threads on one module.

#include "common/devices.h"
#include "common/expect_error.h"
#include "common/temp_path.h"
#include "common/tolerances.h"

#include <torchattn/torchattn.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

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
    << " heads=" << c.heads << " kv_heads=" << c.kv_heads << " head_dim=" << c.head_dim << " d_out=" << c.d_out
    << " qk_norm=" << c.qk_norm << " alibi=" << c.alibi << " softcap=" << c.softcap << " sinks=" << c.sinks
    << " causal=" << c.causal << " qkv_bias=" << c.qkv_bias << " out_bias=" << c.out_bias
    << " window=" << c.window.value_or(0);
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
    if (std::uniform_int_distribution<int>(0, 2)(own) == 0)
      c.d_out = std::uniform_int_distribution<int64_t>(1, 12)(own);
    c.qk_norm = std::uniform_int_distribution<int>(0, 3)(own) % 3;  // none half the time
    // ALiBi where it applies: causal, no RoPE.
    c.alibi = std::uniform_int_distribution<int>(0, 2)(own) == 0 && c.causal && !c.rope;
    if (std::uniform_int_distribution<int>(0, 3)(own) == 0)
      c.softcap = 0.5 + std::uniform_int_distribution<int>(0, 4)(own);
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
  const auto inv_freq = 1.0 /
                        torch::pow(rope.theta(), torch::arange(0, rot, 2, torch::kFloat32) / static_cast<double>(rot));
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
  auto w = [&](const torchattn::Linear& l, const torch::Tensor& in) {
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
    std::vector<torch::Tensor> parts{
        m->forward_cached(on(x.narrow(1, 0, first)), cache, pad.defined() ? on(pad.narrow(1, 0, first)) : pad)};
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
  if (c.dtype == torch::kFloat64 && c.qk_norm > 0 && !c.device.is_cpu()) {
    EXPECT_TRUE(tol::close(got, want, tol::float64_through_float32_norm()));
  } else if (c.dtype == torch::kFloat32 || c.dtype == torch::kFloat64) {
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
  EXPECT_EQ(
      s.str(),
      "torchattn::MultiHeadAttention(d_in=48, d_out=48, context_length=64, num_heads=6, dropout=0, qkv_bias=false, "
      "backend=auto, num_kv_heads=2, out_bias=false, rope=(theta=100000, interleaved=false))");
  std::ostringstream t;
  bert->pretty_print(t);
  EXPECT_EQ(
      t.str(),
      "torchattn::MultiHeadAttention(d_in=48, d_out=48, context_length=64, num_heads=6, dropout=0, qkv_bias=true, "
      "backend=auto, causal=false)");
}

// head_dim of its own (Qwen3, Gemma 2): W_query gives num_heads * head_dim features,
// out_proj maps them back to d_out; caches hold head_dim features per head; the paged
// path gives forward's rows; the same head_dim as d_out / num_heads changes nothing.
TEST(ModernAttention, HeadDimOfItsOwn) {
  torch::manual_seed(3);
  const auto options = torchattn::MultiHeadAttentionOptions(24, 20, 16, 4)
                           .num_kv_heads(2)
                           .head_dim(8)
                           .rope(RoPEOptions(1e4))
                           .out_bias(false);
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
  const auto cached = torch::cat({m->forward_cached(x.narrow(1, 0, 7), cache),
                                  m->forward_cached(x.narrow(1, 7, 4), cache)},
                                 1);
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

// QK-norm (Qwen3, OLMo 2): q_norm and k_norm named as transformers names them, of
// head_dim (per head) or of all the heads' features; recorded in checkpoints; a bad eps
// is an error naming it.
TEST(ModernAttention, QKNormWeightsAndOptions) {
  const auto base = torchattn::MultiHeadAttentionOptions(16, 16, 12, 4).num_kv_heads(2).head_dim(8);
  torchattn::MultiHeadAttention per_head(
      torchattn::MultiHeadAttentionOptions(base).qk_norm(torchattn::QKNormOptions()));
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
  EXPECT_EQ(error_of([&] {
              torchattn::MultiHeadAttention(
                  torchattn::MultiHeadAttentionOptions(base).qk_norm(torchattn::QKNormOptions().eps(0.0)));
            }),
            "MultiHeadAttention: expected qk_norm eps > 0, got 0");
  // Saved with per-head norms: another eps, or none, is named.
  const auto path = temp_path("qk_norm.pt");
  torch::save(per_head, path);
  torchattn::MultiHeadAttention other_eps(
      torchattn::MultiHeadAttentionOptions(base).qk_norm(torchattn::QKNormOptions().eps(1e-5)));
  EXPECT_NE(
      error_of([&] {
        torch::load(other_eps, path);
      }).find("saved with qk_norm_eps=9.9999999999999995e-07, this module has qk_norm_eps=1.0000000000000001e-05"),
      std::string::npos)
      << error_of([&] { torch::load(other_eps, path); });
  torchattn::MultiHeadAttention none(base);
  EXPECT_NE(error_of([&] {
              torch::load(none, path);
            }).find("saved with qk_norm=per_head, this module has qk_norm=none"),
            std::string::npos)
      << error_of([&] { torch::load(none, path); });
  torchattn::MultiHeadAttention same(torchattn::MultiHeadAttentionOptions(base).qk_norm(torchattn::QKNormOptions()));
  torch::load(same, path);
}

// ---------------------------------------------------------------------------
// Concurrency: eight threads on one module in eval mode.
// ---------------------------------------------------------------------------
class Concurrency : public ::testing::TestWithParam<Backend> {};

TEST_P(Concurrency, EightThreadsGetTheSerialResults) {
  torch::manual_seed(31);
  torchattn::MultiHeadAttention mha(
      torchattn::MultiHeadAttentionOptions(16, 16, 32, 4).dropout(0.2).backend(GetParam()));
  mha->eval();
  std::vector<torch::Tensor> xs, serial;
  {
    // As the threads run: without a gradient to compute, Auto takes the CPU's own kernels
    // (another order of sums than ATen's, which a forward with one takes).
    torch::NoGradGuard no_grad;
    for (int i = 0; i < 8; ++i) {
      xs.push_back(torch::randn({2, 1 + 4 * i, 16}));
      serial.push_back(mha(xs.back()));
    }
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

}  // namespace

namespace {

// A move places W_query, W_key and W_value end to end in one storage off the CPU only
// (there decoding computes them as one product); on the CPU, whose kernels keep each
// projection's bits, a move leaves each its own storage. The parameters stay the same
// names and values either way.
TEST(MultiHeadAttentionMoves, PlaceTheProjectionsTogetherOffTheCpuOnly) {
  torch::manual_seed(91);
  torchattn::MultiHeadAttention m(torchattn::MultiHeadAttentionOptions(32, 32, 16, 4).num_kv_heads(2).qkv_bias(true));
  const auto names = m->named_parameters().keys();
  m->to(torch::kFloat64);
  EXPECT_FALSE(torchattn::placed_together({m->W_query.get(), m->W_key.get(), m->W_value.get()}));
#ifdef TORCHATTN_TESTS_CUDA
  devices::skip_unless_present(torch::Device(torch::kCUDA, 0));
  if (testing::Test::IsSkipped() || testing::Test::HasFatalFailure()) return;
  const auto x = torch::randn({2, 5, 32}, torch::kFloat64);
  torch::NoGradGuard no_grad;
  const auto y = m(x);
  m->to(torch::kCUDA);
  EXPECT_TRUE(torchattn::placed_together({m->W_query.get(), m->W_key.get(), m->W_value.get()}));
  EXPECT_EQ(m->named_parameters().keys(), names);
  EXPECT_TRUE(torch::allclose(m(x.to(torch::kCUDA)).cpu(), y, 1e-10, 1e-10));
  auto cache = m->make_kv_cache(2, /*static_shapes=*/true);
  m->forward_cached(x.narrow(1, 0, 4).to(torch::kCUDA), cache);
  EXPECT_TRUE(torch::allclose(m->forward_cached(x.narrow(1, 4, 1).to(torch::kCUDA), cache).cpu(), y.narrow(1, 4, 1),
                              1e-10, 1e-10));
#endif
}

}  // namespace

namespace {

// A module builds what it attends with once (its block and options) and a call follows
// the settings a user changes on the built module: backend, scale, softcap, dropout in
// training and the projections' inference copies, each as a module built with them.
TEST(MultiHeadAttentionHeldState, CallsFollowSettingsChangedOnTheBuiltModule) {
  const auto base = torchattn::MultiHeadAttentionOptions(32, 32, 16, 4).num_kv_heads(2).qkv_bias(true);
  torch::manual_seed(7);
  torchattn::MultiHeadAttention m(base);
  torch::manual_seed(7);
  torchattn::MultiHeadAttention built(
      torchattn::MultiHeadAttentionOptions(base).scale(0.3).softcap(5.0).backend(Backend::Reference));
  m->eval();
  built->eval();
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({2, 9, 32});
  const auto plain = m(x);
  m->options.scale(0.3).softcap(5.0).backend(Backend::Reference);
  EXPECT_TRUE(torch::equal(m(x), built(x)));
  EXPECT_FALSE(torch::allclose(m(x), plain, 1e-3, 1e-3));
  m->options.scale(std::nullopt).softcap(std::nullopt).backend(Backend::Auto);
  EXPECT_TRUE(torch::equal(m(x), plain));
  // Packed bfloat16 copies on, then off again: bfloat16's rounding, then float32's bits.
  m->options.projections({.pack = {.on = true}, .format = torchattn::WeightFormat::BFloat16});
  const auto packed = m(x);
  EXPECT_FALSE(torch::equal(packed, plain));
  EXPECT_TRUE(torch::allclose(packed, plain, 2e-2, 2e-2));
  EXPECT_GT(m->packed_bytes(), 0);
  m->options.projections({});
  EXPECT_TRUE(torch::equal(m(x), plain));
  EXPECT_EQ(m->packed_bytes(), 0);
}

// Dropout follows train() and eval() and a dropout changed on the built module.
TEST(MultiHeadAttentionHeldState, DropoutFollowsTrainEvalAndTheOption) {
  torch::manual_seed(8);
  torchattn::MultiHeadAttention m(torchattn::MultiHeadAttentionOptions(16, 16, 8, 2));
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({1, 6, 16});
  const auto y = m(x);  // training mode, dropout 0
  m->options.dropout(0.5);
  EXPECT_FALSE(torch::equal(m(x), y));
  m->eval();
  EXPECT_TRUE(torch::equal(m(x), y));
  m->train();
  m->options.dropout(0.0);
  EXPECT_TRUE(torch::equal(m(x), y));
}

// A clone attends with its own projections and mask, not the original's.
TEST(MultiHeadAttentionHeldState, AClonesCallsUseItsOwnMembers) {
  torch::manual_seed(9);
  torchattn::MultiHeadAttention m(torchattn::MultiHeadAttentionOptions(16, 16, 8, 2));
  auto c = std::dynamic_pointer_cast<torchattn::MultiHeadAttentionImpl>(m->clone());
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({1, 6, 16});
  const auto y = m(x);
  EXPECT_TRUE(torch::equal(c->forward(x), y));
  c->out_proj->weight.zero_();
  EXPECT_TRUE(torch::equal(c->forward(x), c->out_proj->bias.expand({1, 6, 16})));
  EXPECT_TRUE(torch::equal(m(x), y));
  auto cache = c->make_kv_cache(1);
  EXPECT_TRUE(torch::equal(c->forward_cached(x, cache), c->out_proj->bias.expand({1, 6, 16})));
}

}  // namespace

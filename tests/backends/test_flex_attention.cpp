// flex_attention and create_block_mask (include/torchattn/flex_attention.h) against
// PyTorch's torch.nn.attention.flex_attention on the same mods (tests/golden/flex.txt,
// tests/reference/make_flex_golden.py): the block masks' four tensors equal, outputs and
// log-sum-exps within 1e-12 in float64 and 2e-6 in float32 (and the gradients of q, k
// and v against autograd through the same math in float64), over causal, sliding
// window, prefix-LM, documents (a mask per batch), dilated, ALiBi, softcapping, a
// relative bias table and no mask, with lengths that are not a multiple of the block,
// Tq != Tk, grouped heads and one query row. Then what the block mask saves (mask_mod
// called for partial blocks only), a query that sees no key, a NaN score and misuse.

#include "common/expect_error.h"
#include "common/golden.h"

#include <torchattn/flex_attention.h>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace {

const golden::File& flex_golden() {
  static const golden::File file = golden::load("flex.txt");
  return file;
}

// The mods of make_flex_golden.py, the same formulas (its mods()).
const std::vector<int64_t> kDocs = {0, 70, 150, 257};
const std::vector<int64_t> kDocsB1 = {0, 30, 200, 257};

int64_t doc_of(const std::vector<int64_t>& starts, int64_t i) {
  int64_t d = 0;
  while (d + 2 < static_cast<int64_t>(starts.size()) && i >= starts[static_cast<size_t>(d + 1)]) ++d;
  return d;
}

struct Causal {
  bool operator()(int64_t, int64_t, int64_t q, int64_t kv) const { return q >= kv; }
};
struct Window {
  bool operator()(int64_t, int64_t, int64_t q, int64_t kv) const { return q >= kv && q - kv < 64; }
};
struct Prefix {
  bool operator()(int64_t, int64_t, int64_t q, int64_t kv) const { return kv < 50 || q >= kv; }
};
struct Documents {
  bool operator()(int64_t b, int64_t, int64_t q, int64_t kv) const {
    const auto& starts = b == 0 ? kDocs : kDocsB1;
    return doc_of(starts, q) == doc_of(starts, kv) && q >= kv;
  }
};
struct Dilated {
  bool operator()(int64_t, int64_t, int64_t q, int64_t kv) const { return (q - kv) % 2 == 0 && q >= kv; }
};

// ALiBi: slope 2^(-8 (h + 1) / H) rounded to float32 (a float32 tensor in Python), times
// kv - q in float32, added to the score.
struct Alibi {
  std::vector<float> slopes;
  explicit Alibi(int64_t H) {
    for (int64_t h = 0; h < H; ++h) slopes.push_back(static_cast<float>(std::pow(2.0, -8.0 * (h + 1) / H)));
  }
  template <class T>
  T operator()(T s, int64_t, int64_t h, int64_t q, int64_t kv) const {
    return s + static_cast<T>(slopes[static_cast<size_t>(h)] * static_cast<float>(kv - q));
  }
};
// Math functions called unqualified: the backward's scores are flex::Dual numbers.
struct Softcap {
  template <class T>
  T operator()(T s, int64_t, int64_t, int64_t, int64_t) const {
    using std::tanh;
    return T(20) * tanh(s / T(20));
  }
};
// A captured bias table, one float32 per distance q - kv (sin(0.37 i)).
struct Relative {
  std::vector<float> bias;
  int64_t Tk;
  Relative(int64_t Tq, int64_t tk) : Tk(tk) {
    for (int64_t i = 0; i < Tq + tk - 1; ++i)
      bias.push_back(static_cast<float>(std::sin(0.37 * static_cast<double>(i))));
  }
  template <class T>
  T operator()(T s, int64_t, int64_t, int64_t q, int64_t kv) const {
    return s + static_cast<T>(bias[static_cast<size_t>(q - kv + Tk - 1)]);
  }
};

struct Inputs {
  torch::Tensor q, k, v, dout, dlse;
};

// q, k, v, dout and dlse as make_flex_golden.py draws them (its inputs()), their sums checked.
Inputs inputs_of(const golden::Case& c) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(c.integer("seed")));
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  const int64_t B = c.integer("B"), H = c.integer("H"), Hkv = c.integer("Hkv"), Tq = c.integer("Tq"),
                Tk = c.integer("Tk"), D = c.integer("D");
  Inputs in;
  in.q = at::randn({B, H, Tq, D}, gen, f64);
  in.k = at::randn({B, Hkv, Tk, D}, gen, f64);
  in.v = at::randn({B, Hkv, Tk, D}, gen, f64);
  in.dout = at::randn({B, H, Tq, D}, gen, f64);
  in.dlse = at::randn({B, H, Tq}, gen, f64);
  EXPECT_NEAR(in.q.sum().item<double>(), c.tensor("q_sum").item<double>(), 1e-9) << "q is not PyTorch's";
  EXPECT_NEAR(in.k.sum().item<double>(), c.tensor("k_sum").item<double>(), 1e-9) << "k is not PyTorch's";
  EXPECT_NEAR(in.v.sum().item<double>(), c.tensor("v_sum").item<double>(), 1e-9) << "v is not PyTorch's";
  EXPECT_NEAR(in.dout.sum().item<double>(), c.tensor("dout_sum").item<double>(), 1e-9) << "dout is not PyTorch's";
  EXPECT_NEAR(in.dlse.sum().item<double>(), c.tensor("dlse_sum").item<double>(), 1e-9) << "dlse is not PyTorch's";
  return in;
}

double max_error(const torch::Tensor& got, const torch::Tensor& want) {
  EXPECT_EQ(got.sizes(), want.sizes());
  const auto g = got.to(torch::kDouble), w = want.to(torch::kDouble);
  EXPECT_TRUE(torch::equal(torch::isinf(g), torch::isinf(w))) << "infinities differ";
  const auto finite = torch::isfinite(w);
  return (g.masked_select(finite) - w.masked_select(finite)).abs().max().item<double>();
}

// One case: the block mask against PyTorch's, then flex_attention in float64 and float32.
template <class ScoreMod, class MaskMod>
void check_case(const golden::Case& c, ScoreMod score_mod, MaskMod mask_mod, bool with_mask) {
  const Inputs in = inputs_of(c);
  const int64_t B = c.integer("B"), Tq = c.integer("Tq"), Tk = c.integer("Tk");
  const auto mask = torchattn::create_block_mask(mask_mod, c.integer("per_batch") != 0 ? B : 1, 1, Tq, Tk,
                                                 c.integer("block"));
  if (with_mask) {
    for (const char* name : {"kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"}) {
      const auto want = c.tensor(name).to(torch::kInt32);
      const auto& got = std::string(name) == "kv_num_blocks"        ? mask.kv_num_blocks
                        : std::string(name) == "kv_indices"         ? mask.kv_indices
                        : std::string(name) == "full_kv_num_blocks" ? mask.full_kv_num_blocks
                                                                    : mask.full_kv_indices;
      EXPECT_TRUE(torch::equal(got, want)) << name << ":\n" << got << "\nPyTorch's:\n" << want;
    }
  }
  const auto opts = torchattn::FlexOptions().with_lse();
  for (const auto& [dtype_, tag, bound_] :
       {std::tuple{torch::kFloat64, "f64", 1e-12}, {torch::kFloat32, "f32", 2e-6}}) {
    SCOPED_TRACE(tag);
    const auto dtype = dtype_;  // copies the lambdas below can capture (clang 14 cannot a structured binding)
    const double bound = bound_;
    const auto r = torchattn::flex_attention(in.q.to(dtype), in.k.to(dtype), in.v.to(dtype), score_mod, mask, opts);
    EXPECT_EQ(r.output.scalar_type(), dtype);
    EXPECT_LE(max_error(r.output, c.tensor(std::string("out_") + tag)), bound);
    EXPECT_LE(max_error(r.lse, c.tensor(std::string("lse_") + tag)), bound);
    // The gradients, against autograd through the same math in float64.
    const auto leaf = [&](const torch::Tensor& t) { return t.to(dtype).clone().requires_grad_(); };
    auto q = leaf(in.q), k = leaf(in.k), v = leaf(in.v);
    const auto g = torchattn::flex_attention(q, k, v, score_mod, mask, opts);
    EXPECT_TRUE(torch::equal(g.output, r.output));
    EXPECT_TRUE(g.lse.requires_grad());
    g.output.backward(in.dout.to(dtype), /*retain_graph=*/true);
    // float32 against float64's exact-to-rounding sums: the bound relative where a
    // gradient (a sum over up to a few hundred queries) passes 1 in magnitude.
    const auto expect_grads = [&](const char* suffix) {
      for (const auto& [t, name] : {std::pair{q, "dq"}, {k, "dk"}, {v, "dv"}}) {
        const auto& want = c.tensor(std::string(name) + suffix);
        const torch::Tensor scaled = (t.grad().to(torch::kDouble) - want).abs() / want.abs().clamp_min(1.0);
        EXPECT_LE(scaled.max().item<double>(), bound) << name << suffix;
      }
    };
    expect_grads("_f64");
    // Through the output and the log-sum-exp together (PyTorch's autograd on both).
    for (auto* t : {&q, &k, &v}) t->mutable_grad() = torch::Tensor();
    torch::autograd::backward({g.output, g.lse}, {in.dout.to(dtype), in.dlse.to(dtype)});
    expect_grads("_lse_f64");
  }
}

class FlexGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(FlexGolden, EqualsPyTorchsFlexAttention) {
  const auto& c = flex_golden().get("flex_" + GetParam());
  const std::string mod = c.param("mod");
  const int64_t H = c.integer("H"), Tq = c.integer("Tq"), Tk = c.integer("Tk");
  const torchattn::IdentityScore none;
  if (mod == "causal") return check_case(c, none, Causal{}, true);
  if (mod == "window") return check_case(c, none, Window{}, true);
  if (mod == "prefix") return check_case(c, none, Prefix{}, true);
  if (mod == "documents") return check_case(c, none, Documents{}, true);
  if (mod == "dilated") return check_case(c, none, Dilated{}, true);
  if (mod == "alibi") return check_case(c, Alibi(H), Causal{}, true);
  if (mod == "softcap") return check_case(c, Softcap{}, torchattn::VisibleKeys{}, false);
  if (mod == "relative") return check_case(c, Relative(Tq, Tk), torchattn::VisibleKeys{}, false);
  if (mod == "none") return check_case(c, none, torchattn::VisibleKeys{}, false);
  FAIL() << "no mod " << mod;
}

INSTANTIATE_TEST_SUITE_P(Mods, FlexGolden,
                         ::testing::Values("causal_edges", "causal_grouped", "window", "prefix", "documents", "dilated",
                                           "alibi", "softcap", "relative", "decode_row", "no_mask"));

// The overloads without a block mask or a score_mod are the full call's.
TEST(FlexAttention, TheOverloadsAreTheFullCall) {
  torch::manual_seed(1);
  const auto q = torch::randn({1, 2, 40, 8}), k = torch::randn({1, 2, 50, 8}), v = torch::randn({1, 2, 50, 8});
  const auto mask = torchattn::create_block_mask(Causal{}, 1, 1, 40, 50, 16);
  EXPECT_TRUE(torch::equal(torchattn::flex_attention(q, k, v, mask).output,
                           torchattn::flex_attention(q, k, v, torchattn::IdentityScore{}, mask).output));
  EXPECT_TRUE(
      torch::equal(torchattn::flex_attention(q, k, v, Softcap{}).output,
                   torchattn::flex_attention(q, k, v, Softcap{},
                                             torchattn::create_block_mask(torchattn::VisibleKeys{}, 1, 1, 40, 50))
                       .output));
  EXPECT_FALSE(torchattn::flex_attention(q, k, v, mask).lse.defined());
  // VisibleKeys' block mask is counted, not asked: the same as any mask_mod that sees all.
  const auto counted = torchattn::create_block_mask(torchattn::VisibleKeys{}, 1, 1, 40, 50, 16);
  const auto asked = torchattn::create_block_mask([](int64_t, int64_t, int64_t, int64_t) { return true; }, 1, 1, 40, 50,
                                                  16);
  EXPECT_TRUE(torch::equal(counted.kv_num_blocks, asked.kv_num_blocks));
  EXPECT_TRUE(torch::equal(counted.kv_indices, asked.kv_indices));
  EXPECT_TRUE(torch::equal(counted.full_kv_num_blocks, asked.full_kv_num_blocks));
  EXPECT_TRUE(torch::equal(counted.full_kv_indices, asked.full_kv_indices));
  // The scale, before score_mod: 0.5 here is the default's 1 / sqrt(8) times sqrt(2).
  const auto scaled = torchattn::flex_attention(q, k, v, mask, torchattn::FlexOptions().with_scale(0.5)).output;
  const auto by_q = torchattn::flex_attention(q * std::sqrt(2.0), k, v, mask).output;
  EXPECT_TRUE(torch::allclose(scaled, by_q, 1e-5, 1e-6));
}

// Full blocks never call mask_mod, empty ones are never read: the calls during the
// attention are the keys of the partial blocks, for every batch and head.
TEST(FlexAttention, MaskModRunsOnPartialBlocksOnly) {
  const int64_t T = 300, bs = 32, B = 2, H = 3;
  torch::manual_seed(2);
  const auto q = torch::randn({B, H, T, 8}), k = torch::randn({B, H, T, 8}), v = torch::randn({B, H, T, 8});
  auto calls = std::make_shared<std::atomic<int64_t>>(0);
  const auto counting = [calls](int64_t, int64_t, int64_t q_idx, int64_t kv_idx) {
    ++*calls;
    return q_idx >= kv_idx;
  };
  const auto mask = torchattn::create_block_mask(counting, 1, 1, T, T, bs);
  EXPECT_EQ(*calls, T * T);  // creating: every pair once
  *calls = 0;
  torchattn::flex_attention(q, k, v, mask);
  int64_t want = 0;
  const auto counts = mask.kv_num_blocks.flatten();
  for (int64_t qb = 0; qb < counts.size(0); ++qb) {
    for (int32_t c = 0; c < counts[qb].item<int32_t>(); ++c) {
      const int64_t kb = mask.kv_indices[0][0][qb][c].item<int32_t>();
      want += (std::min(T, (qb + 1) * bs) - qb * bs) * (std::min(T, (kb + 1) * bs) - kb * bs);
    }
  }
  EXPECT_EQ(*calls, B * H * want);
  EXPECT_LT(want, T * T / 4);  // causal in blocks of 32: the diagonal blocks only
  EXPECT_GT(mask.full_kv_num_blocks.sum().item<int64_t>(), 0);
}

// A query that sees no key gets zeros, a log-sum-exp of -inf and no gradient; the
// others are unchanged. A NaN (or +inf) score makes its query's row NaN, and only that row.
TEST(FlexAttention, AQueryThatSeesNothingGetsZerosAndANaNScoreShows) {
  torch::manual_seed(3);
  const auto q = torch::randn({1, 1, 20, 8}, torch::kFloat64), k = torch::randn({1, 1, 20, 8}, torch::kFloat64),
             v = torch::randn({1, 1, 20, 8}, torch::kFloat64);
  const auto late = [](int64_t, int64_t, int64_t q_idx, int64_t kv_idx) { return q_idx >= 5 && q_idx >= kv_idx; };
  const auto r = torchattn::flex_attention(q, k, v, torchattn::create_block_mask(late, 1, 1, 20, 20, 8),
                                           torchattn::FlexOptions().with_lse());
  const auto head = r.output[0][0];
  EXPECT_TRUE(torch::equal(head.slice(0, 0, 5), torch::zeros({5, 8}, torch::kFloat64)));
  EXPECT_TRUE(torch::isneginf(r.lse[0][0].slice(0, 0, 5)).all().item<bool>());
  EXPECT_TRUE(torch::isfinite(r.lse[0][0].slice(0, 5)).all().item<bool>());
  EXPECT_GT(head.slice(0, 5).abs().sum().item<double>(), 0.0);
  // ... and passes no gradient.
  const auto qg = q.clone().requires_grad_();
  torchattn::flex_attention(qg, k, v, torchattn::create_block_mask(late, 1, 1, 20, 20, 8)).output.sum().backward();
  EXPECT_TRUE(torch::equal(qg.grad()[0][0].slice(0, 0, 5), torch::zeros({5, 8}, torch::kFloat64)));
  EXPECT_TRUE(torch::isfinite(qg.grad()).all().item<bool>());
  EXPECT_GT(qg.grad()[0][0].slice(0, 5).abs().sum().item<double>(), 0.0);

  const auto nan_at_7 = [](auto s, int64_t, int64_t, int64_t q_idx, int64_t kv_idx) {
    return q_idx == 7 && kv_idx == 3 ? std::numeric_limits<decltype(s)>::quiet_NaN() : s;
  };
  const auto n = torchattn::flex_attention(q, k, v, nan_at_7, torchattn::FlexOptions().with_lse());
  EXPECT_TRUE(torch::isnan(n.output[0][0][7]).all().item<bool>());
  EXPECT_TRUE(std::isnan(n.lse[0][0][7].item<double>()));
  EXPECT_EQ(torch::isnan(n.output).sum().item<int64_t>(), 8);
}

TEST(FlexAttention, MisuseIsAClearError) {
  const auto q = torch::randn({1, 4, 10, 8}), k = torch::randn({1, 2, 12, 8}), v = torch::randn({1, 2, 12, 8});
  const auto other = torchattn::create_block_mask(Causal{}, 1, 1, 10, 10);
  expect_error([&] { torchattn::flex_attention(q, k, v, other); },
               "flex_attention: block_mask was made for B 1, H 1, q_len 10 and kv_len 10, got q of B 1, H 4 and 10 "
               "positions and k of 12");
  const auto mask = torchattn::create_block_mask(Causal{}, 1, 1, 10, 12);
  expect_error([&] { torchattn::flex_attention(q.to(torch::kHalf), k, v, mask); },
               "flex_attention: expected q of float32 or float64, got Half");
  expect_error([&] { torchattn::flex_attention(q, k.to(torch::kDouble), v, mask); },
               "flex_attention: expected q, k and v of one dtype");
  expect_error([&] { torchattn::flex_attention(torch::randn({1, 3, 10, 8}), k, v, mask); },
               "flex_attention: expected q's heads (3) a multiple of k's (2)");
  expect_error([&] { torchattn::flex_attention(q, torch::randn({1, 2, 12, 4}), v, mask); },
               "flex_attention: expected k of head size 8 (q's), got 4");
  expect_error([&] { torchattn::flex_attention(q[0], k, v, mask); },
               "flex_attention: expected q, k and v of 4 dimensions [B, H, T, D], got 3, 4 and 4");
  // A block mask changed by hand: its tensors are checked before the kernel walks them.
  auto bad = mask;
  bad.kv_indices = mask.kv_indices.clone();
  bad.kv_num_blocks = mask.kv_num_blocks.clone().fill_(1);
  bad.kv_indices.fill_(7);
  expect_error([&] { torchattn::flex_attention(q, k, v, bad); },
               "flex_attention: block_mask's kv_num_blocks lists the key block 7, expected 0 to 0");
  bad.kv_num_blocks.fill_(2);
  expect_error([&] { torchattn::flex_attention(q, k, v, bad); },
               "flex_attention: block_mask's kv_num_blocks holds 2, expected 0 to 1");
  bad = mask;
  bad.full_kv_indices = torch::zeros({1, 1, 1}, torch::kInt32);
  expect_error([&] { torchattn::flex_attention(q, k, v, bad); },
               "flex_attention: expected block_mask's full_kv_num_blocks of int32 [1, 1, 1] and its indices [..., 1]");
  expect_error([&] { torchattn::create_block_mask(Causal{}, 0, 1, 10, 10); },
               "create_block_mask: expected B and H of at least 1, got B 0 and H 1");
  expect_error([&] { torchattn::create_block_mask(Causal{}, 1, 1, 10, 10, 0); },
               "create_block_mask: expected a block_size of at least 1, got 0");
}

}  // namespace

// The library's variants as flex mods (include/torchattn/flex/variants.h) against the
// library's dedicated paths on the same random inputs: outputs with and without grad
// mode, and the gradients of q, k and v, in float64 (within 1e-12) and float32 (within
// 4e-6, relative past 1, of the exact answer and of the dedicated float32 path). Causal,
// the sliding window and ALiBi against backends::attend's MaskSpec (causal, past, window,
// ALiBi's score_bias from backends::alibi_bias), softcapping against the blocked path
// (AttentionOptions::softcap), prefix-LM and the relative bias table against score_bias
// tensors, documents (with a window, with ALiBi) against backends::attend_documents (the
// packed path); over lengths that are not a multiple of the block, Tq != Tk (queries the
// last of the keys), one query row and grouped heads. Then BLOOM's slopes bit for bit,
// misuse, and the masks' runs of keys (flex::RangedMask): each the mask_mod's, and the
// block masks made from them those made key by key.

#include "backends/alibi.h"
#include "backends/attend.h"
#include "backends/attend_documents.h"
#include "backends/blocked.h"
#include "backends/mask_spec.h"
#include "common/expect_error.h"

#include <torchattn/flex/variants.h>
#include <torchattn/flex_attention.h>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <iomanip>
#include <limits>
#include <map>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

// A named namespace: this file shares a unity-build unit with test_flex_attention.cpp.
namespace flex_variants_test {

namespace flex = torchattn::flex;
using torchattn::backends::MaskSpec;
using AttentionFn = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&)>;

// q [B, H, Tq, D], k and v [B, Hkv, Tk, D]; the block masks' block size.
struct Shape {
  const char* name;
  int64_t B, H, Hkv, Tq, Tk, D, block;
  int64_t past() const { return Tk - Tq; }
};

void PrintTo(const Shape& s, std::ostream* os) { *os << s.name; }

const std::vector<Shape> kShapes = {
    {"T200", 2, 4, 4, 200, 200, 16, 128},             // not a multiple of the block
    {"T256_block64", 1, 2, 2, 256, 256, 32, 64},      // a multiple: full blocks
    {"T77_grouped", 1, 8, 2, 77, 77, 8, 32},          // grouped heads, 4 to a key head
    {"T300_grouped", 1, 6, 3, 300, 300, 16, 128},     // three blocks, the last short
    {"chunk_after_cache", 1, 4, 2, 60, 300, 16, 64},  // Tq != Tk: the last 60 of 300 keys
    {"decode_row", 2, 4, 1, 1, 131, 8, 128},          // one query after 130 keys
};

struct Inputs {
  torch::Tensor q, k, v, dout;  // float64
};

Inputs draw(const Shape& s, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  return {at::randn({s.B, s.H, s.Tq, s.D}, gen, f64), at::randn({s.B, s.Hkv, s.Tk, s.D}, gen, f64),
          at::randn({s.B, s.Hkv, s.Tk, s.D}, gen, f64), at::randn({s.B, s.H, s.Tq, s.D}, gen, f64)};
}

// One path's results in `dtype`: the output without grad mode, then with q, k and v
// requiring grad, and their gradients for dout.
struct Run {
  torch::Tensor out_no_grad, out, dq, dk, dv;
};

Run run(const Inputs& in, torch::Dtype dtype, const AttentionFn& fn) {
  Run r;
  {
    torch::NoGradGuard no_grad;
    r.out_no_grad = fn(in.q.to(dtype), in.k.to(dtype), in.v.to(dtype));
  }
  const auto leaf = [&](const torch::Tensor& t) { return t.to(dtype).clone().requires_grad_(); };
  auto q = leaf(in.q), k = leaf(in.k), v = leaf(in.v);
  r.out = fn(q, k, v);
  EXPECT_EQ(r.out.scalar_type(), dtype);
  r.out.backward(in.dout.to(dtype));
  r.out = r.out.detach();
  r.dq = q.grad();
  r.dk = k.grad();
  r.dv = v.grad();
  return r;
}

// max |got - want| / max(|want|, 1): absolute below 1, relative above (a gradient sums
// over many queries and may pass 1).
double max_error(const torch::Tensor& got, const torch::Tensor& want) {
  EXPECT_EQ(got.sizes(), want.sizes());
  const auto g = got.to(torch::kFloat64), w = want.to(torch::kFloat64);
  EXPECT_TRUE(torch::isfinite(g).all().item<bool>()) << "a non-finite value";
  return ((g - w).abs() / w.abs().clamp_min(1.0)).max().item<double>();
}

// The largest error of each kind in the current test, recorded as a property of the
// test (--gtest_output=xml:FILE shows them).
void record(const std::string& key, double error) {
  static std::map<std::string, double> worst;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  double& w = worst[std::string(info->test_suite_name()) + "." + info->name() + "." + key];
  w = std::max(w, error);
  std::ostringstream text;
  text << std::scientific << std::setprecision(2) << w;
  ::testing::Test::RecordProperty(key, text.str());
}

// The flex variant against the dedicated path: outputs (with and without grad mode) and
// the gradients of q, k and v.
// - float64: within 1e-12 of each other (sums in another order, nothing more);
// - float32: the flex variant within 4e-6 of the dedicated path in float64 on the same
//   float32 inputs (the exact answer, to float64's rounding), and within 4e-6 of the
//   dedicated path in float32. Both float32 paths round sums of up to 600 products, each
//   in its own order (ATen's fused kernels and blocked products, the flex kernel's rows):
//   each lands up to about 2e-6 from the exact answer here (17 float32 ulps), the
//   dedicated paths' own error recorded beside the variant's.
void expect_same(const Shape& s, uint64_t seed, const std::function<AttentionFn(torch::Dtype)>& flex_of,
                 const std::function<AttentionFn(torch::Dtype)>& dedicated_of) {
  const Inputs in = draw(s, seed);
  // bound: unset for an error recorded, not asserted.
  const auto compare = [](const Run& got, const Run& want, std::optional<double> bound, const std::string& key) {
    SCOPED_TRACE(key);
    for (const auto& [g, w, name] : {std::tuple{got.out_no_grad, want.out_no_grad, "output without grad"},
                                     {got.out, want.out, "output"},
                                     {got.dq, want.dq, "dq"},
                                     {got.dk, want.dk, "dk"},
                                     {got.dv, want.dv, "dv"}}) {
      const double e = max_error(g, w);
      if (bound) {
        EXPECT_LE(e, *bound) << name;
      }
      record(key, e);
    }
  };
  const Run flex64 = run(in, torch::kFloat64, flex_of(torch::kFloat64)),
            dedicated64 = run(in, torch::kFloat64, dedicated_of(torch::kFloat64));
  compare(flex64, dedicated64, 1e-12, "f64_flex_vs_dedicated");
  // float32, and the exact answer for its rounded inputs.
  const auto rounded = [](const torch::Tensor& t) { return t.to(torch::kFloat32).to(torch::kFloat64); };
  const Inputs in32{rounded(in.q), rounded(in.k), rounded(in.v), rounded(in.dout)};
  const Run exact = run(in32, torch::kFloat64, dedicated_of(torch::kFloat64)),
            flex32 = run(in32, torch::kFloat32, flex_of(torch::kFloat32)),
            dedicated32 = run(in32, torch::kFloat32, dedicated_of(torch::kFloat32));
  compare(flex32, exact, 4e-6, "f32_flex_vs_exact");
  compare(dedicated32, exact, std::nullopt, "f32_dedicated_vs_exact");
  compare(flex32, dedicated32, 4e-6, "f32_flex_vs_dedicated");
}

// flex_attention with a score_mod and a mask_mod's block mask for the shape.
template <class ScoreMod, class MaskMod>
std::function<AttentionFn(torch::Dtype)> flex_with(const Shape& s, ScoreMod score_mod, MaskMod mask_mod) {
  const auto mask = torchattn::create_block_mask(mask_mod, 1, 1, s.Tq, s.Tk, s.block);
  return [=](torch::Dtype) {
    return [=](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
      return torchattn::flex_attention(q, k, v, score_mod, mask).output;
    };
  };
}

// backends::attend with the spec that spec_of gives for the dtype, under `config`.
std::function<AttentionFn(torch::Dtype)> attend_with(std::function<MaskSpec(torch::Dtype)> spec_of,
                                                     torchattn::functional::AttentionOptions config = {}) {
  return [=](torch::Dtype dtype) {
    const MaskSpec spec = spec_of(dtype);
    return [=](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
      return torchattn::backends::attend(q, k, v, spec, config);
    };
  };
}

// backends::blocked_attention (softcap's and sinks' dedicated path, which attend()
// leaves for the named flex instances where they apply) with the spec and config.
std::function<AttentionFn(torch::Dtype)> blocked_with(MaskSpec spec, torchattn::functional::AttentionOptions config) {
  return [=](torch::Dtype) {
    return [=](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
      return torchattn::backends::blocked_attention(q, k, v, spec, config);
    };
  };
}

MaskSpec causal_spec(const Shape& s) {
  MaskSpec spec;
  spec.causal = true;
  spec.past = s.past();
  return spec;
}

// [1, 1, Tq, Tk] of dtype: 0 where mask_mod holds, -inf elsewhere (a score bias that
// masks, for the variants MaskSpec has no flag for).
template <class MaskMod>
torch::Tensor bias_of_mask(const Shape& s, MaskMod mask_mod, torch::Dtype dtype) {
  auto bias = torch::zeros({1, 1, s.Tq, s.Tk}, torch::kFloat64);
  auto a = bias.accessor<double, 4>();
  for (int64_t i = 0; i < s.Tq; ++i) {
    for (int64_t j = 0; j < s.Tk; ++j) {
      if (!mask_mod(0, 0, i, j)) a[0][0][i][j] = -std::numeric_limits<double>::infinity();
    }
  }
  return bias.to(dtype);
}

class FlexVariant : public ::testing::TestWithParam<Shape> {};

TEST_P(FlexVariant, CausalIsMaskSpecCausal) {
  const Shape s = GetParam();
  expect_same(s, 1, flex_with(s, torchattn::IdentityScore{}, flex::Causal(s.past())),
              attend_with([s](torch::Dtype) { return causal_spec(s); }));
}

TEST_P(FlexVariant, SlidingWindowIsMaskSpecWindow) {
  const Shape s = GetParam();
  for (const int64_t window : {int64_t{1}, int64_t{37}, int64_t{64}, s.Tk + 5}) {
    SCOPED_TRACE("window " + std::to_string(window));
    expect_same(s, 2, flex_with(s, torchattn::IdentityScore{}, flex::SlidingWindow(window, s.past())),
                attend_with([s, window](torch::Dtype) {
                  MaskSpec spec = causal_spec(s);
                  spec.window = window;
                  return spec;
                }));
  }
}

TEST_P(FlexVariant, PrefixLMIsItsScoreBias) {
  const Shape s = GetParam();
  for (const int64_t prefix : {int64_t{0}, int64_t{50}, s.Tk}) {
    SCOPED_TRACE("prefix " + std::to_string(prefix));
    const flex::PrefixLM prefix_lm(prefix, s.past());
    expect_same(s, 3, flex_with(s, torchattn::IdentityScore{}, prefix_lm), attend_with([s, prefix](torch::Dtype dtype) {
                  // Written out, not through the mod: the first `prefix` keys, then causal.
                  const auto i = torch::arange(s.Tq).view({s.Tq, 1}) + s.past(), j = torch::arange(s.Tk);
                  MaskSpec spec;
                  spec.score_bias =
                      torch::zeros({1, 1, s.Tq, s.Tk}, dtype)
                          .masked_fill((j < prefix).logical_or(j <= i).logical_not().view({1, 1, s.Tq, s.Tk}),
                                       -std::numeric_limits<double>::infinity());
                  return spec;
                }));
    // The same pattern as or_masks of its two halves.
    const auto in_prefix = [prefix](int64_t, int64_t, int64_t, int64_t kv) { return kv < prefix; };
    EXPECT_TRUE(torch::equal(bias_of_mask(s, prefix_lm, torch::kFloat64),
                             bias_of_mask(s, flex::or_masks(flex::Causal(s.past()), in_prefix), torch::kFloat64)));
  }
}

TEST_P(FlexVariant, AlibiIsTheLibrarysAlibiBias) {
  const Shape s = GetParam();
  // The library's ALiBi: causal, its queries the last Tq keys (backends::alibi_bias).
  expect_same(s, 4, flex_with(s, flex::Alibi(s.H, s.past()), flex::Causal(s.past())),
              attend_with([s](torch::Dtype dtype) {
                MaskSpec spec = causal_spec(s);
                spec.score_bias = torchattn::backends::alibi_bias(torchattn::backends::alibi_slopes(s.H), {}, s.Tq,
                                                                  s.Tk, dtype);
                return spec;
              }));
}

TEST_P(FlexVariant, SoftcapIsTheBlockedPath) {
  const Shape s = GetParam();
  for (const double cap : {1.5, 30.0}) {
    SCOPED_TRACE("softcap " + std::to_string(cap));
    const torchattn::functional::AttentionOptions config{.softcap = cap};
    expect_same(s, 5, flex_with(s, flex::Softcap(cap), flex::Causal(s.past())), blocked_with(causal_spec(s), config));
    expect_same(s, 6, flex_with(s, flex::Softcap(cap), torchattn::VisibleKeys{}), blocked_with(MaskSpec{}, config));
  }
}

TEST_P(FlexVariant, RelativeBiasIsItsScoreBias) {
  const Shape s = GetParam();
  const int64_t M = 20;  // distances -20 .. 20; farther ones share the last entries
  for (const int64_t rows : {s.H, int64_t{1}}) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    torch::manual_seed(7);
    const auto table = torch::randn({rows, 2 * M + 1}, torch::kFloat64);
    const auto score_bias = [s, table, M](torch::Dtype dtype) {
      // Written out: table[h][clamp(j - (past + i), -M, M) + M] as a [1, rows, Tq, Tk] tensor.
      const auto i = torch::arange(s.Tq).view({s.Tq, 1}) + s.past(), j = torch::arange(s.Tk);
      const auto index = (j - i).clamp(-M, M) + M;
      return table.to(dtype).index_select(1, index.flatten()).view({1, table.size(0), s.Tq, s.Tk});
    };
    expect_same(s, 8, flex_with(s, flex::RelativeBias(table, s.past()), torchattn::VisibleKeys{}),
                attend_with([score_bias](torch::Dtype dtype) {
                  MaskSpec spec;
                  spec.score_bias = score_bias(dtype);
                  return spec;
                }));
    expect_same(s, 9, flex_with(s, flex::RelativeBias(table, s.past()), flex::Causal(s.past())),
                attend_with([s, score_bias](torch::Dtype dtype) {
                  MaskSpec spec = causal_spec(s);
                  spec.score_bias = score_bias(dtype);
                  return spec;
                }));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlexVariant, ::testing::ValuesIn(kShapes),
                         [](const ::testing::TestParamInfo<Shape>& info) { return std::string(info.param.name); });

// Documents packed end to end: B, H and Hkv, and cu_seqlens from 0 to N.
struct Packing {
  const char* name;
  int64_t B, H, Hkv, D, block;
  std::vector<int64_t> cu_seqlens;
};

void PrintTo(const Packing& p, std::ostream* os) { *os << p.name; }

const std::vector<Packing> kPackings = {
    {"three", 1, 4, 4, 16, 128, {0, 70, 150, 257}},
    {"grouped_short_docs", 2, 6, 2, 8, 32, {0, 1, 2, 130, 131, 300}},
    {"one_doc", 1, 2, 1, 16, 64, {0, 100}},
    {"block_aligned", 1, 2, 2, 16, 64, {0, 64, 128, 192, 200}},
};

class FlexVariantDocuments : public ::testing::TestWithParam<Packing> {};

// attend_documents as the packed path calls it (block::packed_attention_block_forward):
// each document alone under its MaskSpec, with ALiBi (alibi_heads > 0) a score bias of
// the document's length, its positions from 0.
std::function<AttentionFn(torch::Dtype)> documents_with(const std::vector<int64_t>& cu, bool causal,
                                                        std::optional<int64_t> window, int64_t alibi_heads = 0) {
  std::vector<int64_t> lengths;
  for (size_t d = 0; d + 1 < cu.size(); ++d) lengths.push_back(cu[d + 1] - cu[d]);
  return [=](torch::Dtype dtype) {
    const std::function<MaskSpec(int64_t)> spec_of = [=](int64_t L) {
      MaskSpec spec;
      spec.causal = causal;
      spec.window = window;
      if (alibi_heads > 0) {
        spec.score_bias = torchattn::backends::alibi_bias(torchattn::backends::alibi_slopes(alibi_heads), {}, L, L,
                                                          dtype);
      }
      return spec;
    };
    return [=](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
      return torchattn::backends::attend_documents(q, k, v, lengths, spec_of, {});
    };
  };
}

TEST_P(FlexVariantDocuments, DocumentsAreThePackedPath) {
  const Packing& p = GetParam();
  const int64_t N = p.cu_seqlens.back();
  const Shape s{p.name, p.B, p.H, p.Hkv, N, N, p.D, p.block};
  const flex::Documents causal(p.cu_seqlens);
  ASSERT_EQ(causal.tokens(), N);
  {
    SCOPED_TRACE("causal");
    expect_same(s, 10, flex_with(s, torchattn::IdentityScore{}, causal), documents_with(p.cu_seqlens, true, {}));
  }
  {
    SCOPED_TRACE("bidirectional");
    expect_same(s, 11, flex_with(s, torchattn::IdentityScore{}, flex::Documents(p.cu_seqlens, false)),
                documents_with(p.cu_seqlens, false, {}));
  }
  {
    SCOPED_TRACE("window 24");
    expect_same(s, 12, flex_with(s, torchattn::IdentityScore{}, flex::and_masks(causal, flex::SlidingWindow(24))),
                documents_with(p.cu_seqlens, true, 24));
  }
  {
    SCOPED_TRACE("alibi");  // ALiBi's distances are the same counted from the document's start
    expect_same(s, 13, flex_with(s, flex::Alibi(p.H), causal), documents_with(p.cu_seqlens, true, {}, p.H));
  }
  // From the tensor the modules take (int32 here), the same documents.
  const flex::Documents from_tensor(torch::tensor(p.cu_seqlens, torch::kInt32));
  for (int64_t i = 0; i < N; ++i) ASSERT_EQ(from_tensor.document_of(i), causal.document_of(i)) << i;
  EXPECT_EQ(causal.document_of(N - 1), static_cast<int64_t>(p.cu_seqlens.size()) - 2);
}

INSTANTIATE_TEST_SUITE_P(Packings, FlexVariantDocuments, ::testing::ValuesIn(kPackings),
                         [](const ::testing::TestParamInfo<Packing>& info) { return std::string(info.param.name); });

// Alibi(num_heads) holds the library's slopes bit for bit, for every head count up to 64
// (powers of two and the heads left over past them).
TEST(FlexVariantAlibi, SlopesAreTheLibrarysBitForBit) {
  for (int64_t H = 1; H <= 64; ++H) {
    const auto ours = torch::tensor(flex::Alibi(H).slopes, torch::kFloat64);
    const auto library = torchattn::backends::alibi_slopes(H);
    ASSERT_EQ(ours.numel(), H);
    EXPECT_TRUE(torch::equal(ours.to(torch::kFloat32), library)) << "H " << H;
    EXPECT_TRUE(torch::equal(ours, library.to(torch::kFloat64))) << "H " << H << ": not float32 numbers";
  }
  EXPECT_EQ(flex::Alibi(8).slopes.front(), 0.5);  // 2^(-8/8)
  EXPECT_EQ(flex::Alibi(8).slopes.back(), 1.0 / 256);
}

TEST(FlexVariantMisuse, BadArgumentsAreClearErrors) {
  expect_error([] { flex::SlidingWindow(0); }, "flex::SlidingWindow: expected a window >= 1, got 0");
  expect_error([] { flex::SlidingWindow(4, -1); }, "flex::SlidingWindow: expected an offset >= 0, got -1");
  expect_error([] { flex::Causal(-3); }, "flex::Causal: expected an offset >= 0, got -3");
  expect_error([] { flex::PrefixLM(-1); }, "flex::PrefixLM: expected a prefix >= 0, got -1");
  expect_error([] { flex::Documents(std::vector<int64_t>{0, 5, 5, 9}); },
               "flex::Documents: expected cu_seqlens increasing (every document at least one token), got 5 then 5 at "
               "document 1");
  expect_error([] { flex::Documents(std::vector<int64_t>{1, 5}); },
               "flex::Documents: expected cu_seqlens to start at 0, got 1");
  expect_error([] { flex::Documents(std::vector<int64_t>{0}); },
               "flex::Documents: expected cu_seqlens of [S + 1] with S >= 1 documents, got 1 offsets");
  expect_error([] { flex::Documents(torch::tensor({0.0, 3.0}, torch::kFloat64)); },
               "flex::Documents: expected cu_seqlens [S + 1] int32 or int64, got Double [2]");
  // A block mask longer than the documents: an error when the mask is made.
  expect_error([] { torchattn::create_block_mask(flex::Documents(std::vector<int64_t>{0, 3, 8}), 1, 1, 10, 10); },
               "flex::Documents: cu_seqlens covers 8 tokens, but the keys are 10 and the queries 10 long");
  expect_error([] { flex::Alibi(0); }, "flex::Alibi: expected num_heads >= 1, got 0");
  expect_error([] { flex::Alibi(std::vector<double>{}); }, "flex::Alibi: expected at least one slope");
  expect_error([] { flex::Softcap(0.0); }, "flex::Softcap: expected a finite softcap > 0, got 0");
  expect_error([] { static_cast<void>(flex::Softcap(std::numeric_limits<double>::infinity())); },
               "flex::Softcap: expected a finite softcap > 0, got inf");
  expect_error([] { flex::RelativeBias(torch::zeros({4, 6})); },
               "flex::RelativeBias: expected a floating table [H or 1, 2 * max_distance + 1] (an odd width), got "
               "Float [4, 6]");
  expect_error([] { flex::RelativeBias(torch::zeros({4, 5}, torch::kLong)); },
               "flex::RelativeBias: expected a floating table");
  expect_error([] { flex::RelativeBias(torch::zeros({1, 5}), -2); },
               "flex::RelativeBias: expected an offset >= 0, got -2");
  EXPECT_EQ(flex::RelativeBias(torch::zeros({3, 9})).max_distance(), 4);
}

// Each ready-made mask's keys(q_idx) is the run its mask_mod sees, at every query, over
// lengths and offsets that cut the runs at both ends.
TEST(RangedMasks, EachRunIsWhatTheMaskModSees) {
  const int64_t Tq = 23, Tk = 40;
  auto expect_runs = [&](const auto& mask, const std::string& name, int64_t q_len, int64_t kv_len) {
    static_assert(flex::RangedMask<std::decay_t<decltype(mask)>>);
    for (int64_t i = 0; i < q_len; ++i) {
      const flex::KeyRange run = mask.keys(i);
      for (int64_t j = 0; j < kv_len; ++j) {
        ASSERT_EQ(mask(1, 2, i, j), run.begin <= j && j < run.end) << name << " query " << i << " key " << j;
      }
    }
  };
  for (const int64_t offset : {int64_t{0}, Tk - Tq}) {
    const std::string at = " offset " + std::to_string(offset);
    expect_runs(flex::Causal(offset), "Causal" + at, Tq, Tk);
    expect_runs(flex::SlidingWindow(5, offset), "SlidingWindow(5)" + at, Tq, Tk);
    expect_runs(flex::SlidingWindow(1, offset), "SlidingWindow(1)" + at, Tq, Tk);
    expect_runs(flex::PrefixLM(12, offset), "PrefixLM(12)" + at, Tq, Tk);
    expect_runs(flex::PrefixLM(0, offset), "PrefixLM(0)" + at, Tq, Tk);
    expect_runs(flex::and_masks(flex::Causal(offset), flex::SlidingWindow(7, offset)), "Causal & SlidingWindow" + at,
                Tq, Tk);
  }
  const std::vector<int64_t> cu{0, 5, 6, 19, 30};
  expect_runs(flex::Documents(cu), "Documents causal", 30, 30);
  expect_runs(flex::Documents(cu, /*causal=*/false), "Documents", 30, 30);
  expect_runs(flex::and_masks(flex::Documents(cu), flex::SlidingWindow(4)), "Documents & SlidingWindow", 30, 30);
  expect_runs(torchattn::VisibleKeys{}, "VisibleKeys", Tq, Tk);
  // The composed mask of a flex variant: the module's causal mask and window at a call's
  // positions over the user's mask.
  expect_runs(flex::MaskAtPositions<flex::PrefixLM>{flex::PrefixLM(9), 6, true, 4}, "MaskAtPositions(PrefixLM)", Tq - 6,
              Tk);
  expect_runs(flex::MaskAtPositions<torchattn::VisibleKeys>{{}, 3, true, 0}, "MaskAtPositions(VisibleKeys)", Tq, Tk);
}

// create_block_mask counts a RangedMask's blocks from its runs: the same block mask as
// asking the same mask key by key (a lambda, which names no run), at block sizes that
// cut the runs anywhere.
TEST(RangedMasks, TheirBlockMasksAreThoseMadeKeyByKey) {
  auto same = [](const auto& ranged, const std::string& name, int64_t q_len, int64_t kv_len) {
    const auto asked = [ranged](int64_t b, int64_t h, int64_t i, int64_t j) { return ranged(b, h, i, j); };
    for (const int64_t bs : {int64_t{1}, int64_t{7}, int64_t{16}, int64_t{128}}) {
      SCOPED_TRACE(name + " block_size " + std::to_string(bs));
      const auto a = torchattn::create_block_mask(ranged, 1, 1, q_len, kv_len, bs);
      const auto b = torchattn::create_block_mask(asked, 1, 1, q_len, kv_len, bs);
      EXPECT_TRUE(torch::equal(a.kv_num_blocks, b.kv_num_blocks));
      EXPECT_TRUE(torch::equal(a.full_kv_num_blocks, b.full_kv_num_blocks));
      // Indices past a row's counts are unspecified: compare the counted ones.
      for (int64_t qb = 0; qb < a.shape.q_blocks(); ++qb) {
        const auto ka = a.key_blocks(0, 0, qb);
        const auto kb = b.key_blocks(0, 0, qb);
        for (int kind = 0; kind < 2; ++kind) {
          for (int32_t c = 0; c < ka.count[kind]; ++c) EXPECT_EQ(ka.index[kind][c], kb.index[kind][c]);
        }
      }
    }
  };
  same(flex::Causal(), "Causal", 70, 70);
  same(flex::Causal(33), "Causal(33)", 37, 70);
  same(flex::SlidingWindow(9, 4), "SlidingWindow(9)", 66, 70);
  same(flex::PrefixLM(20), "PrefixLM(20)", 70, 70);
  same(flex::Documents(std::vector<int64_t>{0, 10, 11, 45, 70}), "Documents", 70, 70);
  same(flex::and_masks(flex::Causal(), flex::SlidingWindow(13)), "Causal & SlidingWindow", 70, 70);
}

}  // namespace flex_variants_test

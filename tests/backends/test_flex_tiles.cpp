// flex_attention's float32 forward, the tiled SIMD kernel (detail/flex/cpu_forward_tiles.h),
// against its float64 forward (detail/flex/cpu_forward.h's rows, which test_flex_attention.cpp
// holds to PyTorch within 1e-12) on the same inputs, over the shapes the golden cases
// leave out: head sizes of whole vector tiles (64, 128) and with a tail (80, 33), block
// sizes that are not a multiple of the tile's rows (12, 100), queries and keys past the
// last whole block, grouped heads, strided q and v, and each instruction set
// (ctest's unit_isa_* entries cap it), score_mods key by key and W keys at a time
// (flex/lanes.h: the ready-made Softcap and Alibi, a user's mod through in_lanes); outputs, log-sum-exps and the
// gradients of q, k and v (the tiled backward, flex/cpu_backward_tiles.h). Then the rows that see no key and a NaN
// score, in float32.

#include <torchattn/flex/variants.h>
#include <torchattn/flex_attention.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

namespace {

struct TileCase {
  std::string name;
  std::string mod;
  int64_t B, H, Hkv, Tq, Tk, D, Dv, block;
  bool strided;
  int64_t mask_heads = 0;  // the block mask's heads: 0 for H, 1 for one mask every head shares
};

std::ostream& operator<<(std::ostream& os, const TileCase& c) { return os << c.name; }

class FlexTiles : public ::testing::TestWithParam<TileCase> {};

// The largest |a - b| / (1 + |b|) over the finite entries, and whether a and b are
// finite in the same places.
double error(const torch::Tensor& got, const torch::Tensor& want) {
  const auto g = got.to(torch::kFloat64);
  EXPECT_TRUE(torch::equal(torch::isfinite(g), torch::isfinite(want)));
  const auto finite = torch::isfinite(want);
  return ((g - want).abs() / (want.abs() + 1)).masked_select(finite).max().item<double>();
}

template <class ScoreMod, class MaskMod>
void expect_tiles_match_rows(const TileCase& c, ScoreMod score_mod, MaskMod mask_mod) {
  torch::manual_seed(11);
  auto q = torch::randn({c.B, c.H, c.Tq, c.D}, torch::kFloat64);
  const auto k = torch::randn({c.B, c.Hkv, c.Tk, c.D}, torch::kFloat64);
  auto v = torch::randn({c.B, c.Hkv, c.Tk, c.Dv}, torch::kFloat64);
  const auto mask = torchattn::create_block_mask(mask_mod, c.B, c.mask_heads == 0 ? c.H : c.mask_heads, c.Tq, c.Tk,
                                                 c.block);
  const auto want = torchattn::flex_attention(q, k, v, score_mod, mask, torchattn::FlexOptions().with_lse());
  auto q32 = q.to(torch::kFloat32), k32 = k.to(torch::kFloat32), v32 = v.to(torch::kFloat32);
  if (c.strided) {  // [B, T, H, D] storage seen as [B, H, T, D], and every other column of v
    q32 = q32.transpose(1, 2).contiguous().transpose(1, 2);
    v32 = torch::stack({v32, v32}, -1).flatten(-2).slice(-1, 0, 2 * c.Dv, 2);
    ASSERT_NE(v32.stride(3), 1);
  }
  const auto got = torchattn::flex_attention(q32, k32, v32, score_mod, mask, torchattn::FlexOptions().with_lse());
  EXPECT_LE(error(got.output, want.output), 2e-6) << "output";
  EXPECT_LE(error(got.lse, want.lse), 2e-6) << "lse";

  // The gradients of q, k and v (float32's tiled backward against float64's rows).
  const auto dout = torch::randn({c.B, c.H, c.Tq, c.Dv}, torch::kFloat64);
  const auto grads = [&](const torch::Tensor& q_in, const torch::Tensor& k_in, const torch::Tensor& v_in) {
    auto qg = q_in.detach().requires_grad_(), kg = k_in.detach().requires_grad_(), vg = v_in.detach().requires_grad_();
    torchattn::flex_attention(qg, kg, vg, score_mod, mask).output.backward(dout.to(q_in.scalar_type()));
    return std::vector<torch::Tensor>{qg.grad(), kg.grad(), vg.grad()};
  };
  const auto g64 = grads(q, k, v), g32 = grads(q32, k32, v32);
  for (size_t t = 0; t < 3; ++t) EXPECT_LE(error(g32[t], g64[t]), 2e-6) << "d" << "qkv"[t];
}

TEST_P(FlexTiles, Float32TilesMatchFloat64Rows) {
  const TileCase& c = GetParam();
  const auto causal = [](int64_t, int64_t, int64_t q, int64_t kv) { return q >= kv; };
  const auto window = [](int64_t, int64_t, int64_t q, int64_t kv) { return q >= kv && q - kv < 40; };
  const auto documents = [](int64_t b, int64_t, int64_t q, int64_t kv) {
    const int64_t span = b == 0 ? 37 : 61;
    return q / span == kv / span && q >= kv;
  };
  const auto softcap = [](auto s, int64_t, int64_t, int64_t, int64_t) { return 20.0 * tanh(s / 20.0); };
  const auto alibi = [](auto s, int64_t, int64_t h, int64_t q, int64_t kv) {
    return s - std::exp2(-0.5 * static_cast<double>(h + 1)) * static_cast<double>(q - kv);
  };
  if (c.mod == "causal") {
    expect_tiles_match_rows(c, torchattn::IdentityScore{}, causal);
  } else if (c.mod == "window") {
    expect_tiles_match_rows(c, torchattn::IdentityScore{}, window);
  } else if (c.mod == "documents") {
    expect_tiles_match_rows(c, torchattn::IdentityScore{}, documents);
  } else if (c.mod == "softcap") {
    expect_tiles_match_rows(c, softcap, torchattn::VisibleKeys{});
  } else if (c.mod == "alibi_causal") {
    expect_tiles_match_rows(c, alibi, causal);
  } else if (c.mod == "softcap_lanes") {  // the ready-made mods run W keys at a time (lanes.h)
    expect_tiles_match_rows(c, torchattn::flex::Softcap(20.0), torchattn::VisibleKeys{});
  } else if (c.mod == "alibi_lanes_causal") {
    expect_tiles_match_rows(c, torchattn::flex::Alibi(c.H), causal);
  } else if (c.mod == "alibi_lanes") {
    expect_tiles_match_rows(c, torchattn::flex::Alibi(c.H), torchattn::VisibleKeys{});
  } else if (c.mod == "in_lanes_window") {  // a user's mod marked for lanes, on partial blocks too
    const auto distance = [](auto s, int64_t, int64_t h, int64_t q, auto kv) {
      using T = decltype(s);
      return s - T(0.125) * static_cast<T>(h + 1) * static_cast<T>(q - kv) + T(0.5) * tanh(s);
    };
    expect_tiles_match_rows(c, torchattn::flex::in_lanes(distance), window);
  } else if (c.mod == "ranged_causal") {  // the ready-made masks name their runs (flex::RangedMask)
    expect_tiles_match_rows(c, torchattn::IdentityScore{}, torchattn::flex::Causal(c.Tk - c.Tq));
  } else if (c.mod == "ranged_window") {  // runs that miss whole blocks some rows of a tile see
    expect_tiles_match_rows(c, torchattn::IdentityScore{}, torchattn::flex::SlidingWindow(3, c.Tk - c.Tq));
  } else if (c.mod == "ranged_documents") {
    expect_tiles_match_rows(c, torchattn::IdentityScore{},
                            torchattn::flex::Documents(std::vector<int64_t>{0, 37, 40, 98, c.Tq}));
  } else if (c.mod == "ranged_window_softcap_lanes") {
    expect_tiles_match_rows(c, torchattn::flex::Softcap(20.0), torchattn::flex::SlidingWindow(40));
  } else if (c.mod == "ranged_prefix_softcap") {  // a mod run key by key, on the runs only
    expect_tiles_match_rows(c, softcap, torchattn::flex::PrefixLM(20));
  } else {
    FAIL() << "no mod " << c.mod;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, FlexTiles,
    ::testing::Values(TileCase{"causal_d64", "causal", 1, 2, 1, 300, 300, 64, 64, 128, false},
                      TileCase{"causal_d128_strided", "causal", 1, 2, 2, 130, 200, 128, 128, 64, true},
                      TileCase{"window_d80_block12", "window", 1, 3, 1, 50, 77, 80, 80, 12, false},
                      TileCase{"documents_d33", "documents", 2, 2, 1, 150, 150, 33, 33, 32, true},
                      TileCase{"softcap_d64_block100", "softcap", 1, 2, 2, 205, 190, 64, 48, 100, false},
                      TileCase{"alibi_causal_d64", "alibi_causal", 1, 4, 2, 257, 257, 64, 64, 128, false},
                      TileCase{"one_row", "causal", 1, 4, 1, 1, 301, 64, 64, 128, false},
                      TileCase{"softcap_lanes_d64", "softcap_lanes", 1, 2, 1, 150, 181, 64, 64, 128, false},
                      TileCase{"alibi_lanes_block12", "alibi_lanes_causal", 1, 4, 2, 77, 77, 64, 64, 12, true},
                      TileCase{"in_lanes_window_d33", "in_lanes_window", 2, 2, 2, 90, 90, 33, 33, 32, false},
                      // Fewer rows than a tile, one mask for every head: the G heads of a key
                      // head share tiles, each block of keys packed where it is read.
                      TileCase{"decode_grouped_alibi_lanes", "alibi_lanes", 2, 6, 2, 3, 90, 64, 64, 32, false, 1},
                      TileCase{"decode_grouped_causal_d33", "causal", 1, 8, 2, 2, 200, 33, 33, 64, true, 1},
                      TileCase{"decode_grouped_softcap_keys", "softcap", 1, 4, 1, 1, 257, 64, 48, 100, false, 1},
                      TileCase{"decode_grouped_window_block12", "window", 1, 9, 3, 5, 77, 80, 80, 12, false, 1},
                      // Masks of runs: partial blocks cut after their rows' last key.
                      TileCase{"ranged_causal_d64", "ranged_causal", 1, 2, 1, 300, 300, 64, 64, 128, false},
                      TileCase{"ranged_causal_after_keys", "ranged_causal", 1, 4, 2, 70, 200, 64, 40, 32, true},
                      TileCase{"ranged_window3_block32", "ranged_window", 1, 3, 1, 100, 100, 80, 80, 32, false},
                      TileCase{"ranged_documents_d33", "ranged_documents", 1, 2, 1, 150, 150, 33, 33, 32, true},
                      TileCase{"ranged_window_softcap_lanes", "ranged_window_softcap_lanes", 1, 2, 2, 90, 90, 64, 64,
                               32, false},
                      TileCase{"ranged_prefix_softcap", "ranged_prefix_softcap", 1, 2, 1, 90, 90, 64, 64, 32, false},
                      TileCase{"decode_grouped_ranged_window", "ranged_window", 1, 9, 3, 5, 77, 80, 80, 12, false, 1},
                      // Decoding calls of few tasks over many blocks: the keys split into
                      // parts (split_keys), parts that see no key among them (the window).
                      TileCase{"decode_split_grouped", "ranged_causal", 1, 6, 2, 1, 1500, 64, 64, 32, false, 1},
                      TileCase{"decode_split_window", "ranged_window", 1, 3, 1, 3, 700, 64, 48, 16, true, 1},
                      TileCase{"decode_split_softcap_keys", "softcap", 1, 4, 4, 2, 900, 33, 33, 64, false},
                      TileCase{"decode_split_softcap_lanes", "softcap_lanes", 2, 4, 2, 1, 1100, 64, 64, 128, false, 1}),
    [](const ::testing::TestParamInfo<TileCase>& info) { return info.param.name; });

// float32: a row that sees no key gets zeros and a log-sum-exp of -inf; a NaN score
// makes its row NaN, and only that row, whichever block (full or partial) it is in.
// The lanes of the vector type a kernel runs on.
struct LaneCount {
  static constexpr torchattn::kernels::cpu::Isa kWidest = torchattn::kernels::cpu::Isa::Avx512;
  template <class S>
  static int run() {
    return S::W;
  }
};

// The tiles above run on the vector type of the instruction set this CPU has (the cap
// included), whichever compiler built them: GCC, or clang (make flex-clang), which
// once fell back to plain floats.
TEST(FlexTilesIsa, TheKernelsRunTheWidestVectorTypeTheCpuHasUnderThisCompiler) {
  namespace cpu = torchattn::kernels::cpu;
  const cpu::Isa isa = cpu::best_isa();
  const int want = isa >= cpu::Isa::Avx512 ? 16 : isa == cpu::Isa::Avx2 ? 8 : 1;
  SCOPED_TRACE(::testing::Message() << "compiler " << __VERSION__ << ", instruction set " << cpu::isa_name(isa));
#if defined(__x86_64__)
  EXPECT_EQ(cpu::simd::run_on<LaneCount>(isa), want);
#else
  EXPECT_EQ(cpu::simd::run_on<LaneCount>(isa), 1);
#endif
}

TEST(FlexTilesFloat32, ARowThatSeesNothingGetsZerosAndANaNScoreShows) {
  torch::manual_seed(5);
  const auto q = torch::randn({1, 1, 40, 64}), k = torch::randn({1, 1, 40, 64}), v = torch::randn({1, 1, 40, 64});
  const auto late = [](int64_t, int64_t, int64_t q_idx, int64_t kv_idx) { return q_idx >= 13 && q_idx >= kv_idx; };
  const auto r = torchattn::flex_attention(q, k, v, torchattn::create_block_mask(late, 1, 1, 40, 40, 8),
                                           torchattn::FlexOptions().with_lse());
  const auto head = r.output[0][0];
  EXPECT_TRUE(torch::equal(head.slice(0, 0, 13), torch::zeros({13, 64})));
  EXPECT_TRUE(torch::isneginf(r.lse[0][0].slice(0, 0, 13)).all().item<bool>());
  EXPECT_TRUE(torch::isfinite(head.slice(0, 13)).all().item<bool>());
  EXPECT_TRUE(torch::isfinite(r.lse[0][0].slice(0, 13)).all().item<bool>());

  for (const int64_t key : {3, 20}) {  // a full block of row 30's, then its partial (diagonal) one
    const auto nan_at = [key](auto s, int64_t, int64_t, int64_t q_idx, int64_t kv_idx) {
      return q_idx == 30 && kv_idx == key ? std::numeric_limits<decltype(s)>::quiet_NaN() : s;
    };
    const auto causal = [](int64_t, int64_t, int64_t q_idx, int64_t kv_idx) { return q_idx >= kv_idx; };
    const auto n = torchattn::flex_attention(q, k, v, nan_at, torchattn::create_block_mask(causal, 1, 1, 40, 40, 8),
                                             torchattn::FlexOptions().with_lse());
    EXPECT_TRUE(torch::isnan(n.output[0][0][30]).all().item<bool>()) << key;
    EXPECT_TRUE(std::isnan(n.lse[0][0][30].item<float>())) << key;
    EXPECT_EQ(torch::isnan(n.output).sum().item<int64_t>(), 64) << key;
    EXPECT_EQ(torch::isnan(n.lse).sum().item<int64_t>(), 1) << key;
  }
}

// A decoding call split by keys (split_keys): a row that sees no key of any part gets
// zeros, and a NaN score in one part shows in the row, whichever part holds it.
TEST(FlexTilesFloat32, ASplitDecodingCallJoinsItsParts) {
  torch::manual_seed(6);
  const int64_t Tk = 2000;
  const auto q = torch::randn({1, 2, 1, 64}), k = torch::randn({1, 2, Tk, 64}), v = torch::randn({1, 2, Tk, 64});
  ASSERT_GT(torchattn::flex::split_keys(true, 2, Tk / 64), 1);
  const auto head1 = [](int64_t, int64_t h, int64_t, int64_t) { return h == 1; };
  const auto r = torchattn::flex_attention(q, k, v, torchattn::create_block_mask(head1, 1, 2, 1, Tk, 64),
                                           torchattn::FlexOptions().with_lse());
  EXPECT_TRUE(torch::equal(r.output[0][0], torch::zeros({1, 64})));
  EXPECT_TRUE(std::isinf(r.lse[0][0][0].item<float>()) && r.lse[0][0][0].item<float>() < 0);
  const auto every = torchattn::flex_attention(q, k, v, torchattn::IdentityScore{});
  const auto want = torch::softmax(torch::matmul(q[0][1], k[0][1].transpose(0, 1)).div(8.0), -1).matmul(v[0][1]);
  EXPECT_LT((r.output[0][1] - want).abs().max().item<float>(), 2e-6f);
  EXPECT_LT((every.output[0][1] - want).abs().max().item<float>(), 2e-6f);
  for (const int64_t key : {5, 1000, 1999}) {  // the first part, a middle one, the last
    const auto nan_at = [key](auto s, int64_t, int64_t h, int64_t, int64_t kv_idx) {
      return h == 0 && kv_idx == key ? std::numeric_limits<decltype(s)>::quiet_NaN() : s;
    };
    const auto n = torchattn::flex_attention(q, k, v, nan_at, torchattn::FlexOptions().with_lse());
    EXPECT_TRUE(torch::isnan(n.output[0][0]).all().item<bool>()) << key;
    EXPECT_TRUE(torch::isfinite(n.output[0][1]).all().item<bool>()) << key;
    EXPECT_TRUE(std::isnan(n.lse[0][0][0].item<float>())) << key;
  }
}

}  // namespace

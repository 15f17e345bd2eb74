// WeightFormat::Int4 (src/kernels/cpu/int4_rows.h): the quantized weights equal
// PyTorch's (tests/golden/weights.txt, from tests/reference/make_golden.py), the
// products equal float64 sums over the stored weights within float32 rounding on both
// sides of the matrix-vector kernel's 16 rows (each instruction set: the unit_isa_*
// runs), a copy frozen from stored weights gives the same bits, and what is refused.

#include "common/expect_error.h"
#include "common/golden.h"
#include "common/tolerances.h"

#include "kernels/cpu/int4_rows.h"
#include "kernels/cpu/quantized_linear.h"

#include <torchattn/linear.h>
#include <torchattn/packed_linear.h>
#include <torchattn/weight_format.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <array>
#include <limits>
#include <string>
#include <vector>

namespace {

using torchattn::PackedLinear;
using torchattn::WeightFormat;

// Names of their own: a unity build puts this file beside test_weight_formats.cpp.
const golden::File& int4_golden() {
  static const golden::File file = golden::load("weights.txt");
  return file;
}

// float32 sums of `in` products against float64 ones.
tol::Tolerance int4_sums_of(int64_t in) { return {1e-5, 2e-6 * static_cast<double>(in)}; }

class Int4Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Int4Golden, QuantizedWeightsAndProductsMatchPyTorch) {
  const golden::Case& c = int4_golden().get("int4_" + GetParam());
  torch::NoGradGuard no_grad;
  const auto weight = c.tensor("weight").to(torch::kFloat), bias = c.tensor("bias").to(torch::kFloat);
  const auto x = c.tensor("x").to(torch::kFloat);
  const int64_t out = weight.size(0), in = weight.size(1);

  auto [data, scale] = torchattn::kernels::cpu::quantize_int4_groups(weight);
  ASSERT_EQ(data.scalar_type(), torch::kByte);
  ASSERT_EQ(scale.scalar_type(), torch::kHalf);
  EXPECT_TRUE(torch::equal(data, c.tensor("data"))) << "int4 values differ from PyTorch's";
  EXPECT_TRUE(torch::equal(scale, c.tensor("scale"))) << "(d, m) differ from PyTorch's";
  EXPECT_EQ(scale.sizes(), (std::vector<int64_t>{out, in / 32, 2}));

  PackedLinear int4(WeightFormat::Int4);
  ASSERT_TRUE(int4.takes(x, {weight}, {bias}));
  const auto y = int4.forward(x, {weight}, {bias});
  EXPECT_TRUE(tol::close(y, c.tensor("y").to(torch::kFloat), int4_sums_of(in)));
  // Half a byte a weight, two float16 a group, the bias.
  EXPECT_EQ(int4.packed_bytes(), out * in / 2 + out * (in / 32) * 4 + out * 4);

  // The same weights from their stored form (a saved model, a GGUF file): the same bits.
  PackedLinear stored(WeightFormat::Int4);
  stored.freeze_from({c.tensor("data")}, {c.tensor("scale")}, {bias});
  EXPECT_TRUE(torch::equal(stored.forward(x, {}, {}), y));
  auto [kept, kept_scale] = stored.frozen_weight(0);
  EXPECT_TRUE(torch::equal(kept, data));
  EXPECT_TRUE(torch::equal(kept_scale, scale));
  // Two layers side by side (q, k and v; gate and up): each its own bits.
  const auto pair = int4.forward(x, {weight, weight * 0.5}, {bias, {}});
  EXPECT_TRUE(torch::equal(pair.narrow(-1, 0, out), y));
  PackedLinear half(WeightFormat::Int4);
  EXPECT_TRUE(torch::equal(pair.narrow(-1, out, out), half.forward(x, {weight * 0.5}, {})));
  // A single row without its batch dimension.
  EXPECT_TRUE(torch::equal(stored.forward(x[0], {}, {}), stored.forward(x.narrow(0, 0, 1), {}, {})[0]));
  // Int8 products (Int8Inputs::Quantized, a CausalLM's layers): x quantized per group of
  // 32 by the widest kernel under the TORCHATTN_ISA cap: up to 16 rows the few-rows
  // kernels (the portable loop below AVX2), more the tiles where they apply (AVX2; else
  // the float products above).
  const auto y_products = c.tensor("y_products").to(torch::kFloat);
  const bool few = x.size(0) <= torchattn::kernels::cpu::kQuantizedMatvecRows;
  const bool tiles = torchattn::kernels::cpu::int4::products_tiles_apply(torchattn::kernels::cpu::best_isa());
  EXPECT_TRUE(tol::close(torchattn::kernels::cpu::quantized_linear(x, data, scale, bias,
                                                                   torchattn::kernels::cpu::Int8Products::Int8),
                         few || tiles ? y_products : c.tensor("y").to(torch::kFloat), int4_sums_of(in)));
  PackedLinear quantized(WeightFormat::Int4, torchattn::Int8Inputs::Quantized);
  const bool products = (few || tiles) && torchattn::kernels::cpu::int8_products_auto();
  EXPECT_TRUE(tol::close(quantized.forward(x, {weight}, {bias}),
                         products ? y_products : c.tensor("y").to(torch::kFloat), int4_sums_of(in)));
  if (c.tensors.count("dequantized") > 0) {
    const auto ids = torch::tensor({0, 2, 2, 4}, torch::kLong);
    EXPECT_TRUE(torch::equal(stored.weight_rows(ids), c.tensor("dequantized").index_select(0, ids)));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Int4Golden, ::testing::Values("small", "decode", "serve", "wide", "prefill"));

// Every row count on both sides of the matrix-vector kernel's limit, fused layers,
// leading dimensions, a transposed x: against at::linear on the dequantized weights
// (weight_rows, checked against PyTorch above).
TEST(Int4Weights, MatchTheDequantizedLinearOverShapes) {
  torch::manual_seed(61);
  torch::NoGradGuard no_grad;
  for (const int64_t in : {32, 96, 2112}) {
    const auto w1 = torch::randn({33, in}), w2 = torch::randn({7, in}) * 3.0, b1 = torch::randn({33});
    PackedLinear p(WeightFormat::Int4);
    const auto x0 = torch::randn({1, in});
    p.forward(x0, {w1, w2}, {b1, {}});
    const auto all = p.weight_rows(torch::arange(40, torch::kLong));
    const auto d1 = all.narrow(0, 0, 33), d2 = all.narrow(0, 33, 7);
    for (const int64_t rows : {1, 2, 5, 15, 16, 17, 64}) {
      SCOPED_TRACE(std::to_string(rows) + " rows of " + std::to_string(in));
      const auto x = torch::randn({rows, in});
      const auto want = torch::cat({torch::linear(x, d1, b1), torch::linear(x, d2)}, -1);
      EXPECT_TRUE(tol::close(p.forward(x, {w1, w2}, {b1, {}}), want, int4_sums_of(in)));
    }
    const auto x3 = torch::randn({2, 3, in});
    EXPECT_EQ(p.forward(x3, {w1, w2}, {b1, {}}).sizes(), (std::vector<int64_t>{2, 3, 40}));
    const auto xt = torch::randn({in, 5}).t();
    EXPECT_TRUE(tol::close(p.forward(xt, {w1, w2}, {b1, {}}),
                           torch::cat({torch::linear(xt, d1, b1), torch::linear(xt, d2)}, -1), int4_sums_of(in)));
  }
}

// An infinity in x: its row's outputs not finite (an infinity or NaN), never a number;
// the other rows' as they were.
TEST(Int4Weights, ANonFiniteInputIsNotHidden) {
  torch::manual_seed(62);
  torch::NoGradGuard no_grad;
  PackedLinear p(WeightFormat::Int4);
  auto x = torch::randn({3, 64});
  x[1][40] = std::numeric_limits<float>::infinity();
  const auto w = torch::randn({5, 64});
  for (const int64_t rows : {3, 20}) {
    const auto xs = x.repeat({(rows + 2) / 3, 1}).narrow(0, 0, rows);
    const auto y = p.forward(xs, {w});
    EXPECT_FALSE(torch::isfinite(y[1]).any().item<bool>()) << rows << " rows";
    EXPECT_TRUE(torch::isfinite(y[0]).all().item<bool>()) << rows << " rows";
  }
}

// The int8 products' rows stay their own: a row alone, in any batch up to 16, the same
// bits; an infinity in a row makes that row's outputs not finite.
TEST(Int4Weights, Int8ProductsKeepEachRowsOwnBits) {
  torch::manual_seed(65);
  torch::NoGradGuard no_grad;
  auto [data, scale] = torchattn::kernels::cpu::quantize_int4_groups(torch::randn({13, 96}));
  auto x = torch::randn({16, 96});
  const auto int8 = torchattn::kernels::cpu::Int8Products::Int8;
  const auto all = torchattn::kernels::cpu::quantized_linear(x, data, scale, {}, int8);
  for (const int64_t r : {0, 7, 15}) {
    EXPECT_TRUE(torch::equal(torchattn::kernels::cpu::quantized_linear(x.narrow(0, r, 1), data, scale, {}, int8),
                             all.narrow(0, r, 1)));
  }
  x[3][50] = -std::numeric_limits<float>::infinity();
  const auto y = torchattn::kernels::cpu::quantized_linear(x, data, scale, {}, int8);
  EXPECT_FALSE(torch::isfinite(y[3]).any().item<bool>());
  EXPECT_TRUE(torch::equal(y.narrow(0, 4, 12), all.narrow(0, 4, 12)));
}

// The few-rows kernels under AVX2 (and AVX-512 without VNNI) run the portable loop's
// float32 operations in its order: its bits, for one row of x (the four long streams)
// and for blocks of rows, over shapes (one group, a pair and an odd last one, past a
// chunk of 64 groups), outputs not a multiple of four, groups of equal weights (d = 0)
// and rows of x of zeros. VNNI's kernel sums two groups' lanes apart (within rounding,
// checked against PyTorch above). Under the scalar cap only the portable loop runs.
TEST(Int4Weights, Avx2ProductsAreThePortableLoopsBits) {
  namespace cpu = torchattn::kernels::cpu;
  torch::manual_seed(67);
  torch::NoGradGuard no_grad;
  int64_t compared = 0;
  for (const auto& [out, in] :
       std::vector<std::array<int64_t, 2>>{{13, 96}, {7, 32}, {16, 64}, {9, 2112}, {5, 4256}, {6, 576}}) {
    auto w = torch::randn({out, in});
    w[1].narrow(0, 32, std::min<int64_t>(32, in - 32)).fill_(0.25f);  // d = 0 where in > 32
    auto [data, scale] = cpu::quantize_int4_groups(w);
    const auto bias = torch::randn({out});
    const int64_t groups = in / 32;
    for (const int64_t rows : {1, 2, 3, 5, 16, 21}) {
      SCOPED_TRACE(std::to_string(rows) + " rows, " + std::to_string(out) + " x " + std::to_string(in));
      auto x = torch::randn({rows, in}) * 3;
      if (rows > 2) x[2].zero_();
      std::vector<int8_t> qx(static_cast<size_t>(rows * in));
      std::vector<float> sp(static_cast<size_t>(2 * rows * groups));
      cpu::int4::quantize_inputs(x.const_data_ptr<float>(), rows, in, qx.data(), sp.data());
      const auto products = [&](cpu::Isa isa) {
        auto y = torch::empty({rows, out});
        cpu::int4::dot_rows_products(isa, data.const_data_ptr<uint8_t>(),
                                     reinterpret_cast<const uint16_t*>(scale.const_data_ptr<at::Half>()), in, 0, out,
                                     qx.data(), sp.data(), rows, bias.const_data_ptr<float>(),
                                     y.mutable_data_ptr<float>(), out);
        return y;
      };
      const auto want = products(cpu::Isa::Scalar);
      for (const cpu::Isa isa : cpu::supported_isas()) {
        if (isa >= cpu::Isa::Avx512Vnni) continue;
        EXPECT_TRUE(torch::equal(products(isa), want)) << cpu::isa_name(isa);
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 0);
}

// The prefill's tiles (more than 16 rows, AVX2) against the portable loop of
// the few-rows kernels (checked against PyTorch above) over shapes: panels of 16 outputs
// and a short last one, one group and many, blocks of rows and their ends, more panels
// than a thread repacks at once (27 of 8192 inputs: 12 a run); each row's
// outputs its own bits in any batch that takes the tiles. Where they do not apply
// (TORCHATTN_ISA=scalar; AVX-512, until measured there) a prefill takes the float
// products instead, bit for bit.
TEST(Int4Weights, PrefillTilesMatchThePortableProducts) {
  namespace cpu = torchattn::kernels::cpu;
  const bool tiles = cpu::int4::products_tiles_apply(cpu::best_isa());
  torch::manual_seed(66);
  torch::NoGradGuard no_grad;
  for (const auto& [out, in, rows] : std::vector<std::array<int64_t, 3>>{
           {16, 32, 17}, {40, 64, 18}, {33, 2112, 19}, {7, 96, 70}, {50, 8192, 37}, {430, 8192, 20}}) {
    SCOPED_TRACE(std::to_string(rows) + " rows, " + std::to_string(out) + " x " + std::to_string(in));
    auto [data, scale] = cpu::quantize_int4_groups(torch::randn({out, in}));
    const auto bias = torch::randn({out});
    const auto x = torch::randn({rows, in});
    const auto y = cpu::quantized_linear(x, data, scale, bias, cpu::Int8Products::Int8);
    if (!tiles) {
      EXPECT_TRUE(torch::equal(y, cpu::quantized_linear(x, data, scale, bias, cpu::Int8Products::Float)));
      continue;
    }
    const int64_t groups = in / 32;
    std::vector<int8_t> qx(static_cast<size_t>(rows * in));
    std::vector<float> sp(static_cast<size_t>(2 * rows * groups));
    cpu::int4::quantize_inputs(x.const_data_ptr<float>(), rows, in, qx.data(), sp.data());
    auto want = torch::empty({rows, out});
    cpu::int4::dot_rows_products(cpu::Isa::Scalar, data.const_data_ptr<uint8_t>(),
                                 reinterpret_cast<const uint16_t*>(scale.const_data_ptr<at::Half>()), in, 0, out,
                                 qx.data(), sp.data(), rows, bias.const_data_ptr<float>(),
                                 want.mutable_data_ptr<float>(), out);
    EXPECT_TRUE(tol::close(y, want, int4_sums_of(in)));
    const auto head = cpu::quantized_linear(x.narrow(0, 0, 17), data, scale, bias, cpu::Int8Products::Int8);
    EXPECT_TRUE(torch::equal(head, y.narrow(0, 0, 17)));
  }
}

// Every instruction set quantizes to the same bits (the vector kernels against the
// portable loop): over rows of many scales and groups of constant values, and where a
// group's least or largest value is a zero of either sign (the first such zero's sign
// kept), or its range rounds its d to 0.
TEST(Int4Weights, EveryIsaQuantizesToTheSameBits) {
  namespace cpu = torchattn::kernels::cpu;
  torch::manual_seed(64);
  auto w = torch::randn({24, 32 * 70}) * torch::logspace(-6, 4, 24).unsqueeze(1);
  w[0].zero_();
  w[1].fill_(-0.0f);
  w[2].fill_(3.5f);
  w[3].narrow(0, 0, 64).abs_();
  w[3][5] = 0.0f;
  w[3][9] = -0.0f;
  w[3][40] = -0.0f;
  w[3][44] = 0.0f;
  w[4].narrow(0, 0, 64).abs_().neg_();
  w[4][7] = -0.0f;
  w[4][8] = 0.0f;
  w[4][33] = 0.0f;
  w[4][34] = -0.0f;
  w[5].narrow(0, 0, 32).fill_(1e-8f);  // a range whose d rounds to float16's 0
  w[5][3] = 1.00000001e-8f;
  const auto [want_q, want_s] = cpu::quantize_int4_groups(w, cpu::Isa::Scalar);
  for (const auto isa : cpu::supported_isas()) {
    SCOPED_TRACE(cpu::isa_name(isa));
    const auto [q, s] = cpu::quantize_int4_groups(w, isa);
    EXPECT_TRUE(torch::equal(q, want_q));
    EXPECT_TRUE(torch::equal(s.view(torch::kShort), want_s.view(torch::kShort)));  // the bits, -0 included
  }
  EXPECT_EQ(want_s[3][0][1].view(torch::kShort).item<int16_t>(), 0);  // +0 comes first
  EXPECT_EQ(want_s[3][1][1].view(torch::kShort).item<int16_t>(), static_cast<int16_t>(0x8000));
  auto bad = w.clone();
  bad[7][100] = std::numeric_limits<float>::infinity();
  for (const auto isa : cpu::supported_isas()) {
    expect_error([&] { cpu::quantize_int4_groups(bad, isa); }, "got row 7");
  }
}

TEST(Int4Weights, RefusalsNameWhatDiffers) {
  torch::manual_seed(63);
  torch::NoGradGuard no_grad;
  PackedLinear p(WeightFormat::Int4);
  expect_error([&] { p.freeze({torch::randn({4, 40})}); },
               "int4 weights take layers whose inputs are a multiple of 32 (groups of 32 share a scale), got "
               "in_features 40 (int8 takes any number)");
  auto bad = torch::randn({3, 64});
  bad[2][33] = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { torchattn::kernels::cpu::quantize_int4_groups(bad); },
               "quantize_int4_groups: expected finite weights whose groups' minimum and range / 15 are within "
               "float16's 65504, got row 2");
  auto huge = torch::randn({2, 32});
  huge[1][0] = 1e6;
  expect_error([&] { torchattn::kernels::cpu::quantize_int4_groups(huge); }, "got row 1");

  const auto w = torch::randn({4, 64});
  auto [data, scale] = torchattn::kernels::cpu::quantize_int4_groups(w);
  PackedLinear stored(WeightFormat::Int4);
  expect_error([&] { stored.freeze_from({data}, {}); },
               "PackedLinear: freeze_from expected one scale tensor per weight (1), got 0");
  expect_error([&] { stored.freeze_from({data.to(torch::kChar)}, {scale}); },
               "freeze_from expected weight 0 int4 (uint8, two a byte) CPU [out, 32], got [4, 32] of Char");
  expect_error([&] { stored.freeze_from({data}, {scale.to(torch::kFloat)}); },
               "freeze_from expected the scales of int4 weight 0 float16 CPU [4, 2, 2] (d and m per group of 32 "
               "inputs; 64 inputs, a multiple of 32), got [4, 2, 2] of Float");
  auto broken = scale.clone();
  broken[3][1][1] = std::numeric_limits<float>::infinity();
  expect_error([&] { stored.freeze_from({data}, {broken}); },
               "freeze_from expected finite int4 scales (d, m) of weight 0, got an infinity or NaN at row 3, group 1");
  stored.freeze_from({data}, {scale});
  expect_error([&] { stored.forward(torch::randn({2, 65}), {}); }, "got x [2, 65]");
  expect_error([&] { stored.weight_rows(torch::tensor({4}, torch::kLong)); },
               "dequantized_rows: id 4 is outside the table's 4 rows");
  EXPECT_EQ(torchattn::weight_format_from_string("int4"), WeightFormat::Int4);
  EXPECT_EQ(torchattn::to_string(WeightFormat::Int4), "int4");
}

// A Linear frozen to int4: the float32 weight goes, its products follow the format.
TEST(Int4Weights, ALinearFreezesToInt4) {
  torch::manual_seed(64);
  torchattn::Linear layer(torchattn::LinearOptions(64, 9));
  const auto x = torch::randn({3, 64});
  PackedLinear reference(WeightFormat::Int4);
  torch::Tensor want;
  {
    torch::NoGradGuard no_grad;
    want = reference.forward(x, {layer->weight}, {layer->bias});
  }
  layer->freeze(WeightFormat::Int4);
  EXPECT_EQ(layer->weight_format(), WeightFormat::Int4);
  EXPECT_EQ(layer->weight.stride(0), 0);  // the float32 weight freed
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(layer->forward(x), want));
  auto [data, scale] = layer->frozen_weight();
  EXPECT_EQ(data.sizes(), (std::vector<int64_t>{9, 32}));
  EXPECT_EQ(scale.sizes(), (std::vector<int64_t>{9, 2, 2}));
}

}  // namespace

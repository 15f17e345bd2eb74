// The bfloat16 and int8 weight formats (torchattn::WeightFormat) of PackedLinear and of
// MultiHeadAttention's packed projections: the quantized weights equal PyTorch's
// (tests/golden/weights.txt, from tests/reference/make_golden.py), the products equal
// float64 sums over the stored weights within float32 rounding on both sides of the
// matrix-vector kernel's 16 rows, a frozen copy stands alone, and what is refused.
// DynamicInt8 (PyTorch's quantize_dynamic scheme): the outputs of an nn.Linear
// quantize_dynamic'd in Python, bit for bit.

#include "common/expect_error.h"
#include "common/golden.h"
#include "common/tolerances.h"

#include "kernels/cpu/dynamic_int8_linear.h"
#include "kernels/cpu/int8_products.h"
#include "kernels/cpu/quantized_linear.h"

#include <torchattn/multi_head_attention.h>
#include <torchattn/packed_linear.h>
#include <torchattn/weight_format.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>
#include <string>
#include <vector>

namespace {

using torchattn::PackedLinear;
using torchattn::WeightFormat;

const golden::File& weights_file() {
  static const golden::File file = golden::load("weights.txt");
  return file;
}

// float32 sums of `in` products against float64 ones.
tol::Tolerance sums_of(int64_t in) { return {1e-5, 2e-6 * static_cast<double>(in)}; }

// The int8 format's weights as floats: each group of 64 inputs times its scale.
torch::Tensor dequantize_int8(const torch::Tensor& w) {
  auto [q, s] = torchattn::kernels::cpu::quantize_int8_groups(w);
  return q.to(torch::kFloat) * s.repeat_interleave(64, 1).narrow(1, 0, w.size(1));
}

class WeightFormatGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(WeightFormatGolden, QuantizedWeightsAndProductsMatchPyTorch) {
  const golden::Case& c = weights_file().get("weights_" + GetParam());
  torch::NoGradGuard no_grad;
  const auto weight = c.tensor("weight").to(torch::kFloat), bias = c.tensor("bias").to(torch::kFloat);
  const auto x = c.tensor("x").to(torch::kFloat);
  const int64_t in = weight.size(1);

  auto [q, scale] = torchattn::kernels::cpu::quantize_int8_groups(weight);
  EXPECT_TRUE(torch::equal(q, c.tensor("q"))) << "int8 weights differ from PyTorch's";
  EXPECT_TRUE(torch::equal(scale, c.tensor("scale").to(torch::kFloat))) << "scales differ from PyTorch's";

  PackedLinear int8(WeightFormat::Int8), bf16(WeightFormat::BFloat16);
  ASSERT_TRUE(int8.takes(x, {weight}, {bias}));
  EXPECT_TRUE(tol::close(int8.forward(x, {weight}, {bias}), c.tensor("y_int8").to(torch::kFloat), sums_of(in)));
  // Int8Inputs::Quantized: int8 products where they pay on this CPU (AVX-512 VNNI, AVX2),
  // any number of rows (tests/kernels/test_int8_products.cpp), else the same as Float.
  PackedLinear int8_quantized(WeightFormat::Int8, torchattn::Int8Inputs::Quantized);
  EXPECT_EQ(int8_quantized.int8_inputs(), torchattn::Int8Inputs::Quantized);
  EXPECT_EQ(int8.int8_inputs(), torchattn::Int8Inputs::Float);
  const bool int8_products = torchattn::kernels::cpu::int8_products_auto();
  EXPECT_TRUE(tol::close(int8_quantized.forward(x, {weight}, {bias}),
                         c.tensor(int8_products ? "y_int8_products" : "y_int8").to(torch::kFloat), sums_of(in)));
  EXPECT_TRUE(tol::close(bf16.forward(x, {weight}, {bias}), c.tensor("y_bf16").to(torch::kFloat), sums_of(in)));
  // int8s, a scale per 64 inputs, the bias.
  EXPECT_EQ(int8.packed_bytes(), weight.numel() + scale.numel() * 4 + weight.size(0) * 4);
  EXPECT_EQ(scale.size(1), (in + 63) / 64);
  EXPECT_EQ(bf16.packed_bytes(), weight.numel() * 2 + weight.size(0) * 4);
  // The rows of the stored table, as an embedding reads them.
  const auto ids = torch::tensor({0, 2, 2}, torch::kLong);
  EXPECT_TRUE(torch::equal(int8.weight_rows(ids), c.tensor("dequantized").index_select(0, ids)));
  EXPECT_TRUE(torch::equal(bf16.weight_rows(ids), c.tensor("weight_bf16").index_select(0, ids).to(torch::kFloat)));
}

// PyTorch's own scheme through LibTorch's quantized engine: the same bits as Python's
// quantize_dynamic'd nn.Linear, alone, frozen, and as one of several layers side by side.
TEST_P(WeightFormatGolden, DynamicInt8IsPyTorchsQuantizeDynamic) {
  const golden::Case& c = weights_file().get("weights_" + GetParam());
  torch::NoGradGuard no_grad;
  const auto weight = c.tensor("weight").to(torch::kFloat), bias = c.tensor("bias").to(torch::kFloat);
  const auto x = c.tensor("x").to(torch::kFloat);
  const auto want = c.tensor("y_dynamic_int8").to(torch::kFloat);
  const auto layer = torchattn::kernels::cpu::dynamic_int8_pack(weight, bias);
  EXPECT_EQ(torchattn::kernels::cpu::dynamic_int8_scale(*layer), c.tensor("dynamic_scale").item<double>());
  PackedLinear dynamic(WeightFormat::DynamicInt8);
  ASSERT_TRUE(dynamic.takes(x, {weight}, {bias}));
  const auto y = dynamic.forward(x, {weight}, {bias});
  EXPECT_TRUE(torch::equal(y, want)) << "largest difference " << (y - want).abs().max().item<double>();
  EXPECT_EQ(dynamic.packed_bytes(), weight.numel() + weight.size(0) * 4);
  // Another layer beside it (its own scale) leaves its outputs as they were.
  const auto y2 = dynamic.forward(x, {weight, weight * 3.0}, {bias, {}});
  ASSERT_EQ(y2.size(-1), 2 * weight.size(0));
  EXPECT_TRUE(torch::equal(y2.narrow(-1, 0, weight.size(0)), want));
  PackedLinear frozen(WeightFormat::DynamicInt8);
  frozen.freeze({weight}, {bias});
  EXPECT_TRUE(torch::equal(frozen.forward(x, {}, {}), want));
  // A single row without its batch dimension: that row's outputs alone.
  EXPECT_TRUE(torch::equal(frozen.forward(x[0], {}, {}), frozen.forward(x.narrow(0, 0, 1), {}, {})[0]));
  EXPECT_EQ(frozen.forward(x.reshape({1, x.size(0), x.size(1)}), {}, {}).sizes(),
            (std::vector<int64_t>{1, x.size(0), weight.size(0)}));
  // Not int8's numbers: one scale for the layer, and the input quantized too.
  EXPECT_FALSE(torch::equal(y, c.tensor("y_int8").to(torch::kFloat)));
}

INSTANTIATE_TEST_SUITE_P(Shapes, WeightFormatGolden, ::testing::Values("small", "decode", "serve", "prefill"));

TEST(WeightFormats, DynamicInt8RefusesWhatItDoesNotKeep) {
  torch::manual_seed(55);
  torch::NoGradGuard no_grad;
  const auto w = torch::randn({8, 16}), b = torch::randn({8});
  PackedLinear dynamic(WeightFormat::DynamicInt8);
  expect_error(
      [&] { dynamic.freeze_from({w.to(torch::kChar)}, {torch::ones({8, 1})}); },
      "freeze_from takes bfloat16, int8 or int4 weights, got format dynamic-int8 (its weights are quantized from "
      "float32 by freeze, not loaded)");
  dynamic.freeze({w}, {b});
  EXPECT_EQ(dynamic.frozen_count(), 1u);
  expect_error([&] { dynamic.frozen_weight(0); }, "a dynamic-int8 copy is the quantized engine's packed form");
  expect_error([&] { dynamic.weight_rows(torch::tensor({0}, torch::kLong)); },
               "weight_rows reads a bfloat16, int8 or int4 copy, got a dynamic-int8 copy");
  expect_error([&] { dynamic.forward(torch::randn({2, 15}), {}); },
               "dynamic_int8_linear: expected float32 CPU x [..., 16]");
  auto bad = w.clone();
  bad[3][2] = std::numeric_limits<float>::infinity();
  PackedLinear other(WeightFormat::DynamicInt8);
  expect_error([&] { other.freeze({bad}); }, "dynamic_int8_pack: expected finite weights, got a NaN or infinity");
  EXPECT_EQ(torchattn::weight_format_from_string("dynamic-int8"), WeightFormat::DynamicInt8);
  EXPECT_EQ(torchattn::to_string(WeightFormat::DynamicInt8), "dynamic-int8");
}

// Every row count on both sides of the matrix-vector kernel's limit, fused layers,
// leading dimensions, a transposed x: against at::linear on the dequantized weights.
TEST(WeightFormats, MatchTheDequantizedLinearOverShapes) {
  torch::manual_seed(51);
  torch::NoGradGuard no_grad;
  for (const WeightFormat format : {WeightFormat::BFloat16, WeightFormat::Int8}) {
    for (const int64_t in : {1, 17, 64, 200}) {
      const auto w1 = torch::randn({33, in}), w2 = torch::randn({7, in}), b1 = torch::randn({33});
      const auto dequantized = [&](const torch::Tensor& w) {
        if (format == WeightFormat::BFloat16) return w.to(torch::kBFloat16).to(torch::kFloat);
        return dequantize_int8(w);
      };
      PackedLinear p(format);
      for (const int64_t rows : {1, 2, 15, 16, 17, 64}) {
        SCOPED_TRACE(std::string(torchattn::to_string(format)) + ", " + std::to_string(rows) + " rows of " +
                     std::to_string(in));
        const auto x = torch::randn({rows, in});
        const auto want = torch::cat({torch::linear(x, dequantized(w1), b1), torch::linear(x, dequantized(w2))}, -1);
        EXPECT_TRUE(tol::close(p.forward(x, {w1, w2}, {b1, {}}), want, sums_of(in)));
      }
      const auto x3 = torch::randn({2, 3, in});
      EXPECT_EQ(p.forward(x3, {w1, w2}, {b1, {}}).sizes(), (std::vector<int64_t>{2, 3, 40}));
      const auto xt = torch::randn({in, 5}).t();
      EXPECT_TRUE(
          tol::close(p.forward(xt, {w1, w2}, {b1, {}}),
                     torch::cat({torch::linear(xt, dequantized(w1), b1), torch::linear(xt, dequantized(w2))}, -1),
                     sums_of(in)));
    }
  }
}

TEST(WeightFormats, AFrozenCopyStandsAloneForInference) {
  torch::manual_seed(52);
  auto w = torch::randn({24, 40}), b = torch::randn({24});
  const auto x = torch::randn({3, 40});
  PackedLinear p(WeightFormat::Int8);
  torch::Tensor before;
  {
    torch::NoGradGuard no_grad;
    before = p.forward(x, {w}, {b});
  }
  p.freeze({w}, {b});
  PackedLinear::release(w);
  EXPECT_TRUE(p.frozen());
  EXPECT_EQ(w.sizes(), (std::vector<int64_t>{24, 40}));  // the shape stays, the memory goes
  EXPECT_EQ(w.stride(0), 0);
  EXPECT_FALSE(w.requires_grad());
  torch::NoGradGuard no_grad;
  // The tensors passed afterwards are ignored: the copy is the weights.
  EXPECT_TRUE(torch::equal(p.forward(x, {w}, {b}), before));
  EXPECT_TRUE(torch::equal(p.forward(x, {}, {}), before));
  p.clear();  // not once frozen
  EXPECT_TRUE(torch::equal(p.forward(x, {}, {}), before));
}

TEST(WeightFormats, RefusalsNameWhatDiffers) {
  torch::manual_seed(53);
  const auto w = torch::randn({8, 16}, torch::requires_grad());
  const auto x = torch::randn({2, 16}, torch::requires_grad());
  PackedLinear int8(WeightFormat::Int8);
  // A gradient to compute: not taken, and forward says why.
  EXPECT_FALSE(int8.takes(x, {w}));
  expect_error([&] { int8.forward(x, {w}); }, "dense float32 CPU weights [out, in] (biases [out]) with no gradient");
  {
    torch::NoGradGuard no_grad;
    int8.freeze({w.detach()});
  }
  expect_error([&] { int8.forward(x, {}); },
               "the layer keeps only its int8 weights, for inference: no gradient flows through them");
  {
    torch::NoGradGuard no_grad;
    expect_error([&] { int8.forward(torch::randn({2, 16}, torch::kDouble), {}); },
                 "PackedLinear: the layer keeps its int8 weights frozen, which take float32 inputs on the CPU; got "
                 "Double on cpu");
    expect_error([&] { int8.forward(torch::randn({2, 15}), {}); }, "got x [2, 15]");
    expect_error([&] { int8.weight_rows(torch::tensor({8}, torch::kLong)); },
                 "dequantized_rows: id 8 is outside the table's 8 rows");
  }
  PackedLinear f32;
  expect_error([&] { f32.freeze({w.detach()}); },
               "freeze keeps a bfloat16, int8, int4 or dynamic-int8 copy as the weights, got format float32");
  expect_error([&] { f32.weight_rows(torch::tensor({0}, torch::kLong)); },
               "weight_rows reads a bfloat16, int8 or int4 copy");
  PackedLinear bf16(WeightFormat::BFloat16);
  expect_error([&] { bf16.freeze({torch::randn({4, 3}, torch::kDouble)}); },
               "freeze expected float32 CPU weights [out, in] of one in, got weight 0 [4, 3] of Double");
  auto bad = torch::randn({3, 4});
  bad[2][1] = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { torchattn::kernels::cpu::quantize_int8_groups(bad); },
               "expected finite weights, got a NaN or infinity in row 2");
  // In the vector loop's part of a group and in its tail, a NaN and an infinity (each
  // refused, never converted to an int8: the fuzzers' clang build checks the conversion).
  auto wide = torch::randn({4, 70});
  wide[1][5] = std::numeric_limits<float>::quiet_NaN();
  wide[3][69] = std::numeric_limits<float>::infinity();
  expect_error([&] { torchattn::kernels::cpu::quantize_int8_groups(wide); },
               "expected finite weights, got a NaN or infinity in row 1");
  wide[1][5] = 0.0f;
  expect_error([&] { torchattn::kernels::cpu::quantize_int8_groups(wide); },
               "expected finite weights, got a NaN or infinity in row 3");
  expect_error([] { torchattn::weight_format_from_string("int2"); },
               "weight format: expected one of float32, bfloat16, int8, dynamic-int8, int4, got 'int2'");
  EXPECT_EQ(torchattn::weight_format_from_string("bfloat16"), WeightFormat::BFloat16);
  std::ostringstream s;
  s << WeightFormat::Int8;
  EXPECT_EQ(s.str(), "int8");
}

// MultiHeadAttention with weight_format: its packed projections in the format, equal
// to the float32 module over the dequantized weights; training keeps the float32 path;
// freeze_weights frees the float32 weights and refuses what needs them.
TEST(WeightFormats, MultiHeadAttentionTakesTheFormat) {
  for (const WeightFormat format : {WeightFormat::BFloat16, WeightFormat::Int8}) {
    SCOPED_TRACE(std::string(torchattn::to_string(format)));
    torch::manual_seed(54);
    auto opts = torchattn::MultiHeadAttentionOptions(64, 64, 32, 4).num_kv_heads(2).qkv_bias(true);
    torchattn::MultiHeadAttention mha(opts);
    mha->eval();
    torchattn::MultiHeadAttention plain(opts);
    plain->eval();
    {
      torch::NoGradGuard no_grad;
      for (const auto& item : mha->named_parameters()) {
        const std::string& name = item.key();
        const torch::Tensor& t = item.value();
        torch::Tensor v = t;
        if (name.ends_with(".weight")) {
          if (format == WeightFormat::BFloat16) {
            v = t.to(torch::kBFloat16).to(torch::kFloat);
          } else {
            v = dequantize_int8(t);
          }
        }
        plain->named_parameters()[name].copy_(v);
      }
    }
    mha->options.projections({.pack = {.on = true}, .format = format});
    const auto x = torch::randn({2, 20, 64});
    torch::Tensor want, got;
    {
      torch::NoGradGuard no_grad;
      want = plain->forward(x);
      got = mha->forward(x);
      EXPECT_TRUE(tol::close(got, want, sums_of(64)));
      // A decoding step through the cache (one row: the matrix-vector kernel).
      auto cache = mha->make_kv_cache(2), plain_cache = plain->make_kv_cache(2);
      mha->forward_cached(x.narrow(1, 0, 19), cache);
      plain->forward_cached(x.narrow(1, 0, 19), plain_cache);
      EXPECT_TRUE(tol::close(mha->forward_cached(x.narrow(1, 19, 1), cache),
                             plain->forward_cached(x.narrow(1, 19, 1), plain_cache), sums_of(64)));
    }
    // With a gradient to compute the float32 weights run, and train.
    auto trained = mha->forward(x);
    trained.sum().backward();
    EXPECT_TRUE(mha->W_query->weight.grad().defined());

    mha->freeze_weights();
    EXPECT_TRUE(mha->frozen());
    EXPECT_EQ(mha->W_query->weight.stride(0), 0);
    {
      torch::NoGradGuard no_grad;
      EXPECT_TRUE(tol::close(mha->forward(x), want, sums_of(64)));
      mha->options.projections().pack.on = false;  // a frozen module keeps its copies whatever the option
      EXPECT_TRUE(tol::close(mha->forward(x), want, sums_of(64)));
    }
    expect_error([&] { mha->forward(x.requires_grad_(true)); }, "no gradient flows through them");
    torch::serialize::OutputArchive archive;
    expect_error([&] { mha->save(archive); },
                 "MultiHeadAttention: save needs the float32 weights, which freeze_weights freed");
  }
  torchattn::MultiHeadAttention f32(torchattn::MultiHeadAttentionOptions(8, 8, 4, 2));
  expect_error([&] { f32->freeze_weights(); },
               "freeze_weights keeps bfloat16, int8, int4 or dynamic-int8 copies, got projections.format float32");
}

// MultiHeadAttention with PyTorch's scheme: close to float32 (8-bit weights and inputs),
// the same numbers frozen as packed, and its packed form is not saved.
// options.int8_inputs reaches the packed projections: with Quantized, 16 rows and 40 take
// int8 products on an AVX-512 VNNI CPU (their inputs rounded: close, not equal).
TEST(WeightFormats, MultiHeadAttentionTakesInt8Inputs) {
  torch::NoGradGuard no_grad;
  auto opts = torchattn::MultiHeadAttentionOptions(64, 64, 32, 4)
                  .projections({.pack = {.on = true}, .format = WeightFormat::Int8});
  torch::manual_seed(57);
  torchattn::MultiHeadAttention float_inputs(opts);
  torch::manual_seed(57);  // the same weights
  opts.projections().int8_inputs = torchattn::Int8Inputs::Quantized;
  torchattn::MultiHeadAttention quantized(opts);
  float_inputs->eval();
  quantized->eval();
  for (const int64_t length : {8, 20}) {
    SCOPED_TRACE(std::to_string(2 * length) + " rows");
    const auto x = torch::randn({2, length, 64});
    const auto want = float_inputs->forward(x), got = quantized->forward(x);
    if (torchattn::kernels::cpu::int8_products_auto()) {
      EXPECT_FALSE(torch::equal(got, want));
      EXPECT_LT(((got - want).abs().max() / want.abs().max()).item<double>(), 2e-2);
    } else {
      EXPECT_TRUE(torch::equal(got, want));
    }
  }
}

TEST(WeightFormats, MultiHeadAttentionTakesDynamicInt8) {
  torch::manual_seed(56);
  auto opts = torchattn::MultiHeadAttentionOptions(64, 64, 32, 4).num_kv_heads(2).qkv_bias(true);
  torchattn::MultiHeadAttention mha(opts);
  mha->eval();
  const auto x = torch::randn({2, 20, 64});
  torch::NoGradGuard no_grad;
  const auto plain = mha->forward(x);
  mha->options.projections({.pack = {.on = true}, .format = WeightFormat::DynamicInt8});
  const auto packed = mha->forward(x);
  EXPECT_FALSE(torch::equal(packed, plain));
  EXPECT_LT((packed - plain).abs().max().item<double>(), 0.05 * plain.abs().max().item<double>());
  mha->freeze_weights();
  EXPECT_EQ(mha->W_query->weight.stride(0), 0);
  EXPECT_TRUE(torch::equal(mha->forward(x), packed));
  expect_error([&] { mha->frozen_state(); }, "a dynamic-int8 copy is the quantized engine's packed form");
}

}  // namespace

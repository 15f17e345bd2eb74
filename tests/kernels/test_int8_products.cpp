// Int8 products (src/kernels/cpu/int8_products.h): x quantized per group of 64 of each
// row and multiplied in int32 with the int8 weights. Against PyTorch's float64 numbers
// of the same scheme (tests/golden/weights.txt, y_int8_products from
// tests/reference/make_golden.py) and a float64 reference built here over many shapes;
// every kernel this CPU runs (portable, AVX2, AVX-512 VNNI) gives the same bits; a row gives the same
// bits alone or in any batch; a NaN or an infinity in a row makes that row's outputs
// NaN; and which products quantized_linear picks for how many rows.

#include "common/golden.h"
#include "common/tolerances.h"

#include "kernels/cpu/int8_products.h"
#include "kernels/cpu/quantized_linear.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <string>
#include <vector>

namespace {

namespace kc = torchattn::kernels::cpu;
using kc::Int8Products;

const golden::File& int8_products_golden() {
  static const golden::File file = golden::load("weights.txt");
  return file;
}

tol::Tolerance int8_sums_of(int64_t in) { return {1e-5, 2e-6 * static_cast<double>(in)}; }

// The scheme in float64 from its definition: x's groups quantized like the weights,
// integer sums (exact in float64), each group's times both scales.
torch::Tensor int8_products_reference(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& scale,
                                      const torch::Tensor& bias) {
  const int64_t rows = x.size(0), in = x.size(1), out = q.size(0), groups = scale.size(1);
  const auto pad = [&](const torch::Tensor& t) {
    return torch::constant_pad_nd(t, {0, groups * 64 - in}).reshape({t.size(0), groups, 64});
  };
  const auto xg = pad(x);
  const auto sx = xg.abs().amax(-1) / 127.0f;  // float32, as the kernel divides
  const auto qx = torch::round(xg / torch::where(sx > 0, sx, torch::ones_like(sx)).unsqueeze(-1)).clamp(-127, 127);
  const auto sums = torch::einsum("rgi,ogi->rog", {qx.to(torch::kDouble), pad(q.to(torch::kDouble))});
  auto y = (sums * scale.to(torch::kDouble).unsqueeze(0) * sx.to(torch::kDouble).unsqueeze(1)).sum(-1);
  if (bias.defined()) y = y + bias.to(torch::kDouble);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{rows, out}));
  return y.to(torch::kFloat);
}

// An instruction set for each kernel this CPU runs (under TORCHATTN_ISA): the portable
// loop (Scalar), AVX2's (Avx2; Avx512 runs it too) and VNNI's (Avx512Vnni) where present.
std::vector<kc::Isa> int8_kernels() {
  std::vector<kc::Isa> out;
  for (const kc::Isa isa : kc::supported_isas()) {
    if (isa != kc::Isa::Avx512) out.push_back(isa);
  }
  return out;
}

class Int8ProductsGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(Int8ProductsGolden, EqualPyTorchsNumbersOfTheScheme) {
  const golden::Case& c = int8_products_golden().get("weights_" + GetParam());
  torch::NoGradGuard no_grad;
  const auto weight = c.tensor("weight").to(torch::kFloat), bias = c.tensor("bias").to(torch::kFloat);
  const auto x = c.tensor("x").to(torch::kFloat);
  const auto want = c.tensor("y_int8_products").to(torch::kFloat);
  auto [q, scale] = kc::quantize_int8_groups(weight);
  for (const auto kernel : int8_kernels()) {
    SCOPED_TRACE(kc::int8_kernel_name(kernel));
    EXPECT_TRUE(tol::close(kc::int8_products_linear(x, q, scale, bias, kernel), want, int8_sums_of(weight.size(1))));
  }
  EXPECT_TRUE(
      tol::close(kc::quantized_linear(x, q, scale, bias, Int8Products::Int8), want, int8_sums_of(weight.size(1))));
  // Not the float products: the inputs are rounded too.
  EXPECT_FALSE(tol::close(want, c.tensor("y_int8").to(torch::kFloat), {1e-7, 1e-7}));
}

INSTANTIATE_TEST_SUITE_P(Shapes, Int8ProductsGolden, ::testing::Values("small", "decode", "serve", "prefill"));

// Inputs of whole and short groups (the last group short, in < 4, in % 4 != 0; whole
// fours of groups and groups after them: 256, 576, 1000), outputs
// across the panels (16 outputs: AVX2, 32: VNNI), rows across the tiles (4 and 8) and
// the few-rows kernels (up to 16), with and without a bias.
TEST(Int8Products, EqualTheSchemeInFloat64OverShapesAndKernelsAgreeBitForBit) {
  torch::manual_seed(71);
  torch::NoGradGuard no_grad;
  for (const int64_t in : {1, 3, 63, 64, 65, 130, 256, 576, 1000}) {
    for (const int64_t out : {1, 17, 32, 33, 70}) {
      const auto w = torch::randn({out, in});
      auto [q, scale] = kc::quantize_int8_groups(w);
      for (const int64_t rows : {1, 4, 7, 8, 9, 16, 17}) {
        const auto x = torch::randn({rows, in}) * 3.0;
        for (const bool with_bias : {false, true}) {
          SCOPED_TRACE(std::to_string(rows) + " rows, in " + std::to_string(in) + ", out " + std::to_string(out) +
                       (with_bias ? ", bias" : ""));
          const auto bias = with_bias ? torch::randn({out}) : torch::Tensor();
          const auto want = int8_products_reference(x, q, scale, bias);
          const auto portable = kc::int8_products_linear(x, q, scale, bias, kc::Isa::Scalar);
          EXPECT_TRUE(tol::close(portable, want, int8_sums_of(in)));
          for (const auto kernel : int8_kernels()) {
            EXPECT_TRUE(torch::equal(kc::int8_products_linear(x, q, scale, bias, kernel), portable))
                << kc::int8_kernel_name(kernel);
          }
        }
      }
    }
  }
}

TEST(Int8Products, ARowGivesTheSameBitsAloneOrInABatch) {
  torch::manual_seed(72);
  torch::NoGradGuard no_grad;
  const auto w = torch::randn({70, 200}), b = torch::randn({70});
  auto [q, scale] = kc::quantize_int8_groups(w);
  const auto x = torch::randn({37, 200});
  for (const auto kernel : int8_kernels()) {
    const auto all = kc::int8_products_linear(x, q, scale, b, kernel);
    // Alone, and five rows together (the row kernel), against 37 (the panels).
    for (const auto& [r, n] : std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {8, 1}, {36, 1}, {30, 5}}) {
      EXPECT_TRUE(torch::equal(kc::int8_products_linear(x.narrow(0, r, n).contiguous(), q, scale, b, kernel),
                               all.narrow(0, r, n)))
          << "rows " << r << ".." << r + n - 1 << ", " << kc::int8_kernel_name(kernel);
    }
  }
}

TEST(Int8Products, ANaNOrInfinityInARowMakesItsOutputsNaN) {
  torch::manual_seed(73);
  torch::NoGradGuard no_grad;
  const auto w = torch::randn({40, 150});
  auto [q, scale] = kc::quantize_int8_groups(w);
  auto x = torch::randn({20, 150});
  const auto clean = x.clone();
  x[3][70] = std::numeric_limits<float>::quiet_NaN();
  x[11][149] = std::numeric_limits<float>::infinity();
  x[12][0] = -std::numeric_limits<float>::infinity();
  for (const auto kernel : int8_kernels()) {
    SCOPED_TRACE(kc::int8_kernel_name(kernel));
    const auto y = kc::int8_products_linear(x, q, scale, {}, kernel);
    const auto want = kc::int8_products_linear(clean, q, scale, {}, kernel);
    for (int64_t r = 0; r < 20; ++r) {
      if (r == 3 || r == 11 || r == 12) {
        EXPECT_TRUE(torch::isnan(y[r]).all().item<bool>()) << "row " << r;
      } else {
        EXPECT_TRUE(torch::equal(y[r], want[r])) << "row " << r;
      }
    }
  }
  // A row of zeros: scale 0, outputs 0 (the bias alone).
  const auto b = torch::randn({40});
  for (const auto kernel : int8_kernels()) {
    const auto zero = kc::int8_products_linear(torch::zeros({9, 150}), q, scale, b, kernel);
    EXPECT_TRUE(torch::equal(zero, b.expand({9, 40}))) << kc::int8_kernel_name(kernel);
  }
}

// Auto: int8 products where int8_products_auto says so for this CPU (VNNI and AVX2:
// any number of rows; scalar: never), else the float products; bfloat16 weights always
// float.
TEST(Int8Products, AutoTakesThemWhereTheyPay) {
  torch::manual_seed(74);
  torch::NoGradGuard no_grad;
  const auto w = torch::randn({48, 128}), b = torch::randn({48});
  auto [q, scale] = kc::quantize_int8_groups(w);
  for (const int64_t rows : {int64_t{1}, kc::kQuantizedMatvecRows, kc::kQuantizedMatvecRows + 1, int64_t{64}}) {
    SCOPED_TRACE(std::to_string(rows) + " rows");
    const auto x = torch::randn({rows, 128});
    const auto float_products = kc::quantized_linear(x, q, scale, b, Int8Products::Float);
    const auto int8_products = kc::quantized_linear(x, q, scale, b, Int8Products::Int8);
    ASSERT_FALSE(torch::equal(float_products, int8_products));
    const bool int8_expected = kc::int8_products_auto();
    EXPECT_EQ(int8_expected, kc::best_isa() >= kc::Isa::Avx2);
    EXPECT_TRUE(torch::equal(kc::quantized_linear(x, q, scale, b), int8_expected ? int8_products : float_products));
    const auto wb = w.to(torch::kBFloat16);
    EXPECT_TRUE(torch::equal(kc::quantized_linear(x, wb, {}, b, Int8Products::Int8),
                             kc::quantized_linear(x, wb, {}, b, Int8Products::Float)));
  }
}

// Several weight matrices in one call (a layer's q, k and v; gate and up): each part's
// columns the same bits as that part alone, for int8 (float and int8 products, every
// kernel) and bfloat16, in decoding (one parallel region over every part) and prefill.
TEST(Int8Products, PartsGiveEachPartsOwnBits) {
  torch::manual_seed(75);
  torch::NoGradGuard no_grad;
  const int64_t in = 200;
  const std::vector<int64_t> outs{48, 16, 16};
  std::vector<kc::QuantizedWeight> int8_parts, bf16_parts;
  for (size_t i = 0; i < outs.size(); ++i) {
    const auto w = torch::randn({outs[i], in});
    auto [q, scale] = kc::quantize_int8_groups(w);
    const auto b = i == 1 ? torch::Tensor() : torch::randn({outs[i]});  // one part without a bias
    int8_parts.push_back({q, scale, b});
    bf16_parts.push_back({w.to(torch::kBFloat16), {}, b});
  }
  ASSERT_TRUE(kc::quantized_linear_applies(torch::randn({1, in}), int8_parts));
  ASSERT_FALSE(kc::quantized_linear_applies(torch::randn({1, in}), {int8_parts[0], bf16_parts[1]}));
  for (const int64_t rows : {1, 5, 16, 17, 40}) {
    SCOPED_TRACE(std::to_string(rows) + " rows");
    const auto x = torch::randn({rows, in});
    for (const auto products : {Int8Products::Float, Int8Products::Int8}) {
      const auto all = kc::quantized_linear(x, int8_parts, products);
      ASSERT_EQ(all.sizes(), (std::vector<int64_t>{rows, 80}));
      int64_t col = 0;
      for (const auto& p : int8_parts) {
        EXPECT_TRUE(torch::equal(all.narrow(1, col, p.data.size(0)),
                                 kc::quantized_linear(x, p.data, p.scale, p.bias, products)))
            << "int8 part at column " << col << (products == Int8Products::Int8 ? ", int8 products" : "");
        col += p.data.size(0);
      }
    }
    for (const auto kernel : int8_kernels()) {
      const auto all = kc::int8_products_linear(x, int8_parts, kernel);
      int64_t col = 0;
      for (const auto& p : int8_parts) {
        EXPECT_TRUE(torch::equal(all.narrow(1, col, p.data.size(0)),
                                 kc::int8_products_linear(x, p.data, p.scale, p.bias, kc::Isa::Scalar)))
            << kc::int8_kernel_name(kernel) << ", part at column " << col;
        col += p.data.size(0);
      }
    }
    const auto all = kc::quantized_linear(x, bf16_parts);
    int64_t col = 0;
    for (const auto& p : bf16_parts) {
      EXPECT_TRUE(torch::equal(all.narrow(1, col, p.data.size(0)), kc::quantized_linear(x, p.data, p.scale, p.bias)))
          << "bfloat16 part at column " << col;
      col += p.data.size(0);
    }
  }
  // A mixed call is refused, naming what it expected.
  try {
    (void)kc::quantized_linear(torch::randn({1, in}), {int8_parts[0], bf16_parts[1]});
    ADD_FAILURE() << "a mixed call was taken";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("every part of one dtype and one in"), std::string::npos) << e.what();
  }
}

// The kernel of each instruction set, by name; one wider than this CPU runs is refused
// through the one guard, naming the function, its limit and what came.
TEST(Int8Products, NamesTheKernelsAndRefusesOnesThisCpuLacks) {
  EXPECT_STREQ(kc::int8_kernel_name(kc::Isa::Scalar), "portable");
  EXPECT_STREQ(kc::int8_kernel_name(kc::Isa::Avx2), "avx2");
  EXPECT_STREQ(kc::int8_kernel_name(kc::Isa::Avx512), "avx2");
  EXPECT_STREQ(kc::int8_kernel_name(kc::Isa::Avx512Vnni), "vnni");
  if (kc::best_isa() == kc::Isa::Avx512Vnni) return;  // every kernel runs here
  torch::NoGradGuard no_grad;
  auto [q, scale] = kc::quantize_int8_groups(torch::randn({4, 64}));
  const kc::Isa wider = static_cast<kc::Isa>(static_cast<int>(kc::best_isa()) + 1);
  try {
    kc::int8_products_linear(torch::randn({1, 64}), q, scale, {}, wider);
    ADD_FAILURE() << kc::isa_name(wider) << " was taken";
  } catch (const c10::Error& e) {
    const std::string want = std::string("int8_products_linear: expected an instruction set up to ") +
                             kc::isa_name(kc::best_isa()) + ", got " + kc::isa_name(wider);
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

}  // namespace

// Int8 products (src/kernels/cpu/int8_products.h): x quantized per group of 64 of each
// row and multiplied in int32 with the int8 weights. Against PyTorch's float64 numbers
// of the same scheme (tests/golden/weights.txt, y_int8_products from
// tests/reference/make_golden.py) and a float64 reference built here over many shapes;
// the AVX-512 VNNI kernel and the portable loop give the same bits; a row gives the same
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

// The kernels this CPU runs: the portable loop, and the VNNI kernel where present.
std::vector<bool> int8_kernels() {
  std::vector<bool> k{false};
  if (kc::int8_products_vnni()) k.push_back(true);
  return k;
}

class Int8ProductsGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(Int8ProductsGolden, EqualPyTorchsNumbersOfTheScheme) {
  const golden::Case& c = int8_products_golden().get("weights_" + GetParam());
  torch::NoGradGuard no_grad;
  const auto weight = c.tensor("weight").to(torch::kFloat), bias = c.tensor("bias").to(torch::kFloat);
  const auto x = c.tensor("x").to(torch::kFloat);
  const auto want = c.tensor("y_int8_products").to(torch::kFloat);
  auto [q, scale] = kc::quantize_int8_groups(weight);
  for (const bool vnni : int8_kernels()) {
    SCOPED_TRACE(vnni ? "vnni" : "portable");
    EXPECT_TRUE(tol::close(kc::int8_products_linear(x, q, scale, bias, vnni), want, int8_sums_of(weight.size(1))));
  }
  EXPECT_TRUE(
      tol::close(kc::quantized_linear(x, q, scale, bias, Int8Products::Int8), want, int8_sums_of(weight.size(1))));
  // Not the float products: the inputs are rounded too.
  EXPECT_FALSE(tol::close(want, c.tensor("y_int8").to(torch::kFloat), {1e-7, 1e-7}));
}

INSTANTIATE_TEST_SUITE_P(Shapes, Int8ProductsGolden, ::testing::Values("small", "decode", "serve", "prefill"));

// Inputs of whole and short groups (the last group short, in < 4, in % 4 != 0), outputs
// across the 32-output panels, rows across the 8-row tiles, with and without a bias.
TEST(Int8Products, EqualTheSchemeInFloat64OverShapesAndKernelsAgreeBitForBit) {
  torch::manual_seed(71);
  torch::NoGradGuard no_grad;
  for (const int64_t in : {1, 3, 63, 64, 65, 130, 576}) {
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
          const auto portable = kc::int8_products_linear(x, q, scale, bias, false);
          EXPECT_TRUE(tol::close(portable, want, int8_sums_of(in)));
          if (kc::int8_products_vnni()) {
            EXPECT_TRUE(torch::equal(kc::int8_products_linear(x, q, scale, bias, true), portable));
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
  for (const bool vnni : int8_kernels()) {
    const auto all = kc::int8_products_linear(x, q, scale, b, vnni);
    // Alone, and five rows together (the row kernel), against 37 (the panels).
    for (const auto& [r, n] : std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {8, 1}, {36, 1}, {30, 5}}) {
      EXPECT_TRUE(torch::equal(kc::int8_products_linear(x.narrow(0, r, n).contiguous(), q, scale, b, vnni),
                               all.narrow(0, r, n)))
          << "rows " << r << ".." << r + n - 1 << (vnni ? ", vnni" : ", portable");
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
  for (const bool vnni : int8_kernels()) {
    SCOPED_TRACE(vnni ? "vnni" : "portable");
    const auto y = kc::int8_products_linear(x, q, scale, {}, vnni);
    const auto want = kc::int8_products_linear(clean, q, scale, {}, vnni);
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
  const auto zero = kc::int8_products_linear(torch::zeros({9, 150}), q, scale, b, kc::int8_products_vnni());
  EXPECT_TRUE(torch::equal(zero, b.expand({9, 40})));
}

// Auto: int8 products where the CPU has VNNI (any number of rows: the row kernel up to
// kQuantizedMatvecRows, the panels beyond), else the float products; bfloat16 weights
// always float.
TEST(Int8Products, AutoTakesThemOnVnniOnly) {
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
    const bool int8_expected = kc::int8_products_vnni();
    EXPECT_TRUE(torch::equal(kc::quantized_linear(x, q, scale, b), int8_expected ? int8_products : float_products));
    const auto wb = w.to(torch::kBFloat16);
    EXPECT_TRUE(torch::equal(kc::quantized_linear(x, wb, {}, b, Int8Products::Int8),
                             kc::quantized_linear(x, wb, {}, b, Int8Products::Float)));
  }
}

}  // namespace

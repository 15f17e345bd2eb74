// functional::linear: the decoding kernel for a few float32 CPU rows against
// at::linear, and the cases it leaves to at::linear (a gradient to compute, more
// rows, other dtypes).

#include "tolerances.h"

#include <torchattn/functional.h>

#include "../src/kernels/cpu/linear.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace {

TEST(Linear, FewRowsMatchAtLinearWithAndWithoutBias) {
  torch::manual_seed(11);
  torch::NoGradGuard no_grad;
  for (const int64_t rows : {1, 2, 5, 8}) {
    for (const int64_t in : {1, 7, 64, 577}) {
      const auto w = torch::randn({33, in}), b = torch::randn({33}), x = torch::randn({rows, in});
      ASSERT_TRUE(torchattn::kernels::cpu::small_linear_applies(x, w, b));
      // Sums of `in` products in another order: float32 rounding grows with in.
      const tol::Tolerance t{1e-5, 1e-6 * static_cast<double>(in)};
      EXPECT_TRUE(tol::close(torchattn::functional::linear(x, w, b), torch::linear(x, w, b), t)) << rows << "x" << in;
      EXPECT_TRUE(tol::close(torchattn::functional::linear(x, w), torch::linear(x, w), t)) << rows << "x" << in;
    }
  }
  // Leading dimensions are kept: [1, 1, in] -> [1, 1, out].
  const auto w = torch::randn({10, 6});
  EXPECT_EQ(torchattn::functional::linear(torch::randn({1, 1, 6}), w).sizes(), (std::vector<int64_t>{1, 1, 10}));
}

TEST(Linear, OtherCasesAreAtLinear) {
  torch::manual_seed(12);
  const auto w = torch::randn({8, 4}), x = torch::randn({2, 4});
  using torchattn::kernels::cpu::small_linear_applies;
  {
    torch::NoGradGuard no_grad;
    EXPECT_FALSE(small_linear_applies(torch::randn({9, 4}), w, {}));  // more rows: a GEMM
    EXPECT_FALSE(small_linear_applies(x.to(torch::kDouble), w.to(torch::kDouble), {}));
    EXPECT_FALSE(small_linear_applies(x, w.t().contiguous().t(), {}));  // not a dense [out, in]
  }
  auto wg = w.clone().requires_grad_(true);
  EXPECT_FALSE(small_linear_applies(x, wg, {}));  // a gradient to compute
  torchattn::functional::linear(x, wg).sum().backward();
  EXPECT_TRUE(torch::equal(wg.grad(), torch::ones({8, 2}).matmul(x)));
  EXPECT_TRUE(torch::equal(torchattn::functional::linear(torch::randn({9, 4}).fill_(1), w),
                           torch::linear(torch::ones({9, 4}), w)));
}

} // namespace

// functional::linear: the decoding kernel for a few float32 CPU rows and the oneDNN
// path for more rows, against at::linear, and the cases it leaves to at::linear (a
// gradient to compute, other dtypes, strided weights).

#include "common/tolerances.h"

#include <torchattn/functional.h>

#include "kernels/cpu/linear.h"
#include "kernels/cpu/onednn_linear.h"

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
      // One row takes the kernel's one-dispatch path, more rows a dot per row and output:
      // the same bits for the same row.
      const auto one = torchattn::kernels::cpu::small_linear(x.narrow(0, 0, 1), w, b);
      EXPECT_TRUE(torch::equal(one, torchattn::kernels::cpu::small_linear(x, w, b).narrow(0, 0, 1)))
          << rows << "x" << in;
    }
  }
  // Leading dimensions are kept: [1, 1, in] -> [1, 1, out].
  const auto w = torch::randn({10, 6});
  EXPECT_EQ(torchattn::functional::linear(torch::randn({1, 1, 6}), w).sizes(), (std::vector<int64_t>{1, 1, 10}));
}

TEST(Linear, ManyRowsGoThroughOneDnnAndMatchAtLinear) {
  torch::manual_seed(13);
  torch::NoGradGuard no_grad;
  // LibTorch's x86 CPU builds (this project's) register oneDNN's operator; a build
  // without it takes at::linear, which the other tests cover.
  ASSERT_TRUE(torchattn::kernels::cpu::onednn_linear_applies(torch::randn({9, 4}), torch::randn({3, 4}), {}));
  for (const int64_t rows : {9, 33, 512}) {
    for (const int64_t in : {1, 7, 576}) {
      const auto w = torch::randn({65, in}), b = torch::randn({65}), x = torch::randn({2, rows, in});
      ASSERT_TRUE(torchattn::kernels::cpu::onednn_linear_applies(x, w, b));
      EXPECT_FALSE(torchattn::kernels::cpu::small_linear_applies(x, w, b));
      const tol::Tolerance t{1e-5, 1e-6 * static_cast<double>(in)};
      EXPECT_TRUE(tol::close(torchattn::functional::linear(x, w, b), torch::linear(x, w, b), t)) << rows << "x" << in;
      EXPECT_TRUE(tol::close(torchattn::functional::linear(x, w), torch::linear(x, w), t)) << rows << "x" << in;
    }
  }
  // A non-contiguous x is made contiguous first.
  const auto w = torch::randn({5, 6}), x = torch::randn({6, 20}).t();
  EXPECT_TRUE(tol::close(torchattn::functional::linear(x, w), torch::linear(x, w), tol::Tolerance{1e-5, 1e-5}));
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
  EXPECT_FALSE(torchattn::kernels::cpu::onednn_linear_applies(torch::randn({9, 4}), wg, {}));
  {
    torch::NoGradGuard no_grad;
    using torchattn::kernels::cpu::onednn_linear_applies;
    EXPECT_FALSE(onednn_linear_applies(torch::randn({9, 4}, torch::kDouble), w.to(torch::kDouble), {}));
    EXPECT_FALSE(onednn_linear_applies(torch::randn({9, 4}), w.t().contiguous().t(), {}));
  }
  // Gradients through the many-row path are at::linear's.
  auto xg = torch::randn({9, 4}).requires_grad_(true);
  torchattn::functional::linear(xg, w).sum().backward();
  EXPECT_TRUE(torch::equal(xg.grad(), torch::ones({9, 8}).matmul(w)));
  torchattn::functional::linear(x, wg).sum().backward();
  EXPECT_TRUE(torch::equal(wg.grad(), torch::ones({8, 2}).matmul(x)));
}

}  // namespace

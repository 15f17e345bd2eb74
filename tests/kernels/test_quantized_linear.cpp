// The bfloat16 weights' decoding kernel (src/kernels/cpu/quantized_linear.cpp, DotRows):
// one row of x against bfloat16 weight rows, several rows at a time on AVX2 and one at
// a time on AVX-512. An output gets the same bits whatever rows it is computed with (a
// layer of any size, the threads' split of it), and equals float64 linear over the
// widened weights within float32 rounding, over sizes with every kind of tail.

#include <torchattn/detail/kernels/cpu/cpu_features.h>
#include "kernels/cpu/quantized_linear.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>

namespace {

namespace kc = torchattn::kernels::cpu;

TEST(QuantizedLinear, ABfloat16DecodingOutputHasItsBitsWhereverItFalls) {
  torch::manual_seed(81);
  torch::NoGradGuard no_grad;
  for (const int64_t in : {1, 15, 16, 17, 31, 33, 200, 2048}) {
    for (const int64_t out : {1, 3, 4, 5, 9, 70}) {
      SCOPED_TRACE("in " + std::to_string(in) + ", out " + std::to_string(out) + ", " + kc::isa_name(kc::best_isa()));
      const auto x = torch::randn({1, in});
      const auto w = torch::randn({out, in}).to(torch::kBFloat16), b = torch::randn({out});
      const auto y = kc::quantized_linear(x, w, {}, b);
      const auto want = torch::linear(x.to(torch::kDouble), w.to(torch::kDouble), b.to(torch::kDouble));
      EXPECT_TRUE(torch::allclose(y.to(torch::kDouble), want, 1e-5, 1e-6 * std::sqrt(static_cast<double>(in))))
          << (y.to(torch::kDouble) - want).abs().max().item<double>();
      for (int64_t o = 0; o < out; ++o) {
        // The output alone, and with the rows from it on (another place among four).
        const auto alone = kc::quantized_linear(x, w.narrow(0, o, 1), {}, b.narrow(0, o, 1));
        const auto from_o = kc::quantized_linear(x, w.narrow(0, o, out - o), {}, b.narrow(0, o, out - o));
        EXPECT_TRUE(torch::equal(alone, y.narrow(1, o, 1))) << o;
        EXPECT_TRUE(torch::equal(from_o.narrow(1, 0, 1), y.narrow(1, o, 1))) << o;
      }
    }
  }
}

}  // namespace

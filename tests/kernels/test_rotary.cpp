// The CPU rotary kernel (kernels/cpu/rotary.cpp) against functional::apply_rotary.

#include "common/tolerances.h"

#include <torchattn/torchattn.h>

#include "kernels/cpu/rotary.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

using torchattn::RoPEOptions;

namespace {

// The modules' one-pass CPU kernel gives the composite functional::apply_rotary's
// numbers to the bit, forward and backward, in every dtype, layout and position form.
TEST(ModernAttention, CpuRotaryKernelEqualsTheComposite) {
  for (const auto dtype : {torch::kFloat32, torch::kFloat64, torch::kBFloat16, torch::kFloat16}) {
    for (const bool interleaved : {false, true}) {
      for (const int64_t rot : {int64_t{8}, int64_t{4}}) {
        for (const bool per_sequence : {false, true}) {
          SCOPED_TRACE(std::string(c10::toString(dtype)) + (interleaved ? " interleaved" : "") + " rotary_dim " +
                       std::to_string(rot) + (per_sequence ? " [B, T] positions" : " [T] positions"));
          torch::manual_seed(9);
          const auto rope = RoPEOptions(1e4).interleaved(interleaved).rotary_dim(rot);
          const auto [cos, sin] = torchattn::functional::rotary_tables(rope, 8, 12);
          const auto pos = per_sequence ? torch::randint(0, 12, {2, 7}, torch::kLong) : torch::arange(3, 10);
          auto a = torch::randn({2, 7, 3, 8}).to(dtype).requires_grad_(true);  // [B, T, G, head_dim]
          auto b = a.detach().clone().requires_grad_(true);
          auto kernel = torchattn::kernels::cpu::rotary(a, pos, cos, sin, rot, interleaved);
          auto composite = torchattn::functional::apply_rotary(b.transpose(1, 2), pos, cos, sin, rope).transpose(1, 2);
          EXPECT_TRUE(torch::equal(kernel, composite));
          const auto g = torch::randn({2, 7, 3, 8}).to(dtype);
          kernel.backward(g);
          composite.backward(g);
          EXPECT_TRUE(tol::close(a.grad(), b.grad(), tol::for_dtype(dtype)));
        }
      }
    }
  }
  const auto [cos, sin] = torchattn::functional::rotary_tables(RoPEOptions(), 8, 4);
  try {
    torchattn::kernels::cpu::rotary(torch::zeros({1, 2, 1, 8}), torch::tensor({1, 4}), cos, sin, 8, false);
    ADD_FAILURE() << "a position past the tables was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("rotary: expected positions in [0, 4)"), std::string::npos);
  }
}

}  // namespace

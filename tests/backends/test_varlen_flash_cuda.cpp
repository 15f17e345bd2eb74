// ATen's variable-length flash attention for packed documents on CUDA
// (src/backends/varlen_flash.h): where it applies (half and bfloat16, grouped heads,
// causal or not), functional::attention_packed and MultiHeadAttention::forward_packed
// take it, and equal each document alone in float64 on the CPU within the dtype's
// rounding, outputs and gradients; and what it refuses (float32, a window, dropout in
// training, a head size flash does not take, the CPU). Built in a CUDA configuration
// only; skipped without a GPU (and failing under TORCHATTN_REQUIRE_CUDA=1).

#include "common/devices.h"
#include "common/tolerances.h"

#include "backends/varlen_flash.h"

#include <torchattn/torchattn.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace {

using torchattn::backends::MaskSpec;
using torchattn::backends::varlen_flash_applies;

const torch::Device kVarlenCuda(torch::kCUDA, 0);

// ||a - b|| / ||b||, both as float64 on the CPU.
double varlen_relative(const torch::Tensor& a, const torch::Tensor& b) {
  const auto x = a.to(torch::kCPU, torch::kDouble), y = b.to(torch::kCPU, torch::kDouble);
  return ((x - y).norm() / y.norm()).item<double>();
}

double varlen_limit(torch::Dtype dtype) { return dtype == torch::kBFloat16 ? 1e-2 : 2e-3; }

class VarlenFlash : public ::testing::TestWithParam<torch::Dtype> {
 protected:
  void SetUp() override { devices::skip_unless_present(kVarlenCuda); }
};

TEST_P(VarlenFlash, AttentionPackedEqualsEachDocumentAlone) {
  const torch::Dtype dtype = GetParam();
  const std::vector<int64_t> lens{1, 37, 3, 128, 37, 1, 64};
  std::vector<int64_t> cu{0};
  for (const int64_t L : lens) cu.push_back(cu.back() + L);
  const int64_t N = cu.back();
  for (const int64_t kv_heads : {4, 2}) {
    for (const bool causal : {true, false}) {
      SCOPED_TRACE(std::string(causal ? "causal" : "not causal") + ", " + std::to_string(kv_heads) + " kv heads");
      torch::manual_seed(91);
      const auto q64 = torch::randn({1, 4, N, 64}, torch::kDouble),
                 k64 = torch::randn({1, kv_heads, N, 64}, torch::kDouble);
      const auto v64 = torch::randn({1, kv_heads, N, 64}, torch::kDouble);
      auto on_gpu = [&](const torch::Tensor& t) { return t.to(kVarlenCuda, dtype).requires_grad_(true); };
      const auto q = on_gpu(q64), k = on_gpu(k64), v = on_gpu(v64);
      MaskSpec spec;
      spec.causal = causal;
      ASSERT_TRUE(varlen_flash_applies(q, k, v, spec, {}));
      const auto got = torchattn::functional::attention_packed(q, k, v, torch::tensor(cu).to(kVarlenCuda), causal);
      // The reference: each document alone in float64 on the CPU, from the same rounded inputs.
      auto ref = [&](const torch::Tensor& t) {
        return t.detach().to(torch::kCPU, torch::kDouble).requires_grad_(true);
      };
      const auto qr = ref(q), kr = ref(k), vr = ref(v);
      std::vector<torch::Tensor> parts;
      for (size_t s = 0; s < lens.size(); ++s) {
        const auto mask = causal ? torchattn::functional::causal_mask_buffer(lens[s], torch::kDouble) : torch::Tensor();
        parts.push_back(torchattn::functional::attention(qr.narrow(2, cu[s], lens[s]), kr.narrow(2, cu[s], lens[s]),
                                                         vr.narrow(2, cu[s], lens[s]), mask, 0, {}));
      }
      const auto want = torch::cat(parts, 2);
      EXPECT_LT(varlen_relative(got, want), varlen_limit(dtype)) << "output";
      const auto w = torch::randn(want.sizes(), torch::kDouble);
      const auto g_got = torch::autograd::grad({(got * w.to(kVarlenCuda, dtype)).sum()}, {q, k, v});
      const auto g_want = torch::autograd::grad({(want * w).sum()}, {qr, kr, vr});
      for (size_t i = 0; i < 3; ++i) EXPECT_LT(varlen_relative(g_got[i], g_want[i]), 2 * varlen_limit(dtype)) << i;
    }
  }
}

// The module: 2 heads of 64 (flash's sizes), grouped or not, RoPE restarting in each
// document; against the same module in float64 on the CPU, each document alone.
TEST_P(VarlenFlash, ForwardPackedEqualsEachDocumentAlone) {
  const torch::Dtype dtype = GetParam();
  const std::vector<int64_t> lens{5, 1, 96, 17, 96};
  std::vector<int64_t> cu{0};
  for (const int64_t L : lens) cu.push_back(cu.back() + L);
  const int64_t N = cu.back();
  for (const int64_t kv_heads : {2, 1}) {
    SCOPED_TRACE(std::to_string(kv_heads) + " kv heads");
    torch::manual_seed(92);
    const auto opts =
        torchattn::MultiHeadAttentionOptions(128, 128, 96, 2).num_kv_heads(kv_heads).rope(torchattn::RoPEOptions());
    torchattn::MultiHeadAttention gpu(opts), cpu(opts);
    cpu->to(torch::kDouble);
    {
      torch::NoGradGuard no_grad;
      const auto from = cpu->parameters();
      auto to = gpu->parameters();
      for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
    }
    gpu->to(kVarlenCuda, dtype);
    torch::manual_seed(93);
    const auto x64 = torch::randn({N, 128}, torch::kDouble);
    const auto x = x64.to(kVarlenCuda, dtype).requires_grad_(true);
    const auto y = gpu->forward_packed(x, torch::tensor(cu).to(kVarlenCuda, torch::kInt));
    const auto xr = x.detach().to(torch::kCPU, torch::kDouble).requires_grad_(true);
    std::vector<torch::Tensor> ys;
    for (size_t s = 0; s < lens.size(); ++s) ys.push_back(cpu(xr.narrow(0, cu[s], lens[s]).unsqueeze(0)).squeeze(0));
    const auto want = torch::cat(ys, 0);
    EXPECT_LT(varlen_relative(y, want), 2 * varlen_limit(dtype)) << "output";
    const auto w = torch::randn(want.sizes(), torch::kDouble);
    (y * w.to(kVarlenCuda, dtype)).sum().backward();
    (want * w).sum().backward();
    EXPECT_LT(varlen_relative(x.grad(), xr.grad()), 4 * varlen_limit(dtype)) << "input gradient";
    const auto pg = gpu->parameters(), pc = cpu->parameters();
    for (size_t i = 0; i < pg.size(); ++i) {
      EXPECT_LT(varlen_relative(pg[i].grad(), pc[i].grad()), 4 * varlen_limit(dtype)) << "weight " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, VarlenFlash, ::testing::Values(torch::kBFloat16, torch::kHalf),
                         [](const ::testing::TestParamInfo<torch::Dtype>& info) {
                           return std::string(info.param == torch::kBFloat16 ? "bf16" : "f16");
                         });

class VarlenFlashRefuses : public ::testing::Test {
 protected:
  void SetUp() override { devices::skip_unless_present(kVarlenCuda); }
};

TEST_F(VarlenFlashRefuses, WhatItCannotRun) {
  const auto q = torch::randn({1, 4, 20, 64}, torch::TensorOptions().device(kVarlenCuda).dtype(torch::kBFloat16));
  MaskSpec causal;
  causal.causal = true;
  EXPECT_TRUE(varlen_flash_applies(q, q, q, causal, {}));
  EXPECT_FALSE(varlen_flash_applies(q.to(torch::kFloat), q.to(torch::kFloat), q.to(torch::kFloat), causal, {}));
  EXPECT_FALSE(varlen_flash_applies(q.cpu(), q.cpu(), q.cpu(), causal, {}));
  MaskSpec window = causal;
  window.window = 8;
  EXPECT_FALSE(varlen_flash_applies(q, q, q, window, {}));
  EXPECT_FALSE(varlen_flash_applies(q, q, q, causal, {.dropout = 0.1, .training = true}));
  EXPECT_TRUE(varlen_flash_applies(q, q, q, causal, {.dropout = 0.1, .training = false}));
  EXPECT_FALSE(varlen_flash_applies(q, q, q, causal, {.backend = torchattn::Backend::Reference}));
  EXPECT_FALSE(varlen_flash_applies(q, q, q, causal, {.softcap = 20.0}));
  const auto small = torch::randn({1, 4, 20, 4}, q.options());
  EXPECT_FALSE(varlen_flash_applies(small, small, small, causal, {}));
  const auto two = torch::randn({2, 4, 20, 64}, q.options());
  EXPECT_FALSE(varlen_flash_applies(two, two, two, causal, {}));
}

}  // namespace

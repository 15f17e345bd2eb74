// Which fused kernel the SDPA backend calls: the decision is a pure function of
// host values, checked here on every machine; the CUDA kernels themselves run in
// the device-parametrized tests when a GPU is present.

#include "backends/sdpa.h"
#include "backends/repeated_shapes.h"

#include "common/tolerances.h"
#include <torchattn/detail/kernels/cpu/cpu_features.h>

#include <ATen/SDPBackend.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <limits>
#include <string>
#include <thread>
#include <vector>

namespace {

using torchattn::backends::choose_fused_kernel;
using torchattn::backends::FusedKernel;
using torchattn::backends::KernelQuery;

constexpr int64_t kCudnn = static_cast<int64_t>(at::SDPBackend::cudnn_attention);
constexpr int64_t kFlash = static_cast<int64_t>(at::SDPBackend::flash_attention);
constexpr int64_t kMath = static_cast<int64_t>(at::SDPBackend::math);

// bf16, no mask, not causal, Tq = Tk = 128, head_dim 64, ATen picking cuDNN.
KernelQuery cudnn_call() {
  KernelQuery q;
  q.cuda = true;
  q.aten_choice = kCudnn;
  q.dtype = c10::ScalarType::BFloat16;
  q.Tq = q.Tk = 128;
  q.head_dim = q.v_head_dim = 64;
  return q;
}

struct ChoiceCase {
  std::string name;
  KernelQuery query;
  FusedKernel expected;
};

std::vector<ChoiceCase> choice_cases() {
  std::vector<ChoiceCase> out;
  auto add = [&](std::string name, auto edit, FusedKernel expected) {
    KernelQuery q = cudnn_call();
    edit(q);
    out.push_back({std::move(name), q, expected});
  };
  add("CpuIsAlwaysATen", [](KernelQuery& q) { q.cuda = false; }, FusedKernel::ATen);
  add("ATenPickingFlashIsKept", [](KernelQuery& q) { q.aten_choice = kFlash; }, FusedKernel::ATen);
  add("ATenPickingMathIsKept", [](KernelQuery& q) { q.aten_choice = kMath; }, FusedKernel::ATen);
  add("CudnnAllowedIsKept", [](KernelQuery& q) { q.allow_cudnn = true; }, FusedKernel::ATen);
  add("CudnnAtARepeatedShapeIsKept", [](KernelQuery& q) { q.repeated = true; }, FusedKernel::ATen);
  add(
      "RepeatedShapeKeepsATensFlash",
      [](KernelQuery& q) {
        q.repeated = true;
        q.aten_choice = kFlash;
      },
      FusedKernel::ATen);
  add("CudnnBecomesFlash", [](KernelQuery&) {}, FusedKernel::Flash);
  add("CausalSquareBecomesFlash", [](KernelQuery& q) { q.is_causal = true; }, FusedKernel::Flash);
  add("HalfBecomesFlash", [](KernelQuery& q) { q.dtype = c10::ScalarType::Half; }, FusedKernel::Flash);
  add("HeadDim256BecomesFlash", [](KernelQuery& q) { q.head_dim = q.v_head_dim = 256; }, FusedKernel::Flash);
  add("MaskBecomesEfficient", [](KernelQuery& q) { q.has_mask = true; }, FusedKernel::Efficient);
  add("HeadDim512BecomesEfficient", [](KernelQuery& q) { q.head_dim = q.v_head_dim = 512; }, FusedKernel::Efficient);
  add("FlashSwitchedOffBecomesEfficient", [](KernelQuery& q) { q.flash_enabled = false; }, FusedKernel::Efficient);
  add("Float32BecomesEfficient", [](KernelQuery& q) { q.dtype = c10::ScalarType::Float; }, FusedKernel::Efficient);
  add(
      "BothSwitchedOffStayATen", [](KernelQuery& q) { q.flash_enabled = q.efficient_enabled = false; },
      FusedKernel::ATen);
  add(
      "MaskWithEfficientOffStaysATen",
      [](KernelQuery& q) {
        q.has_mask = true;
        q.efficient_enabled = false;
      },
      FusedKernel::ATen);
  add("UnalignedHeadDimStaysATen", [](KernelQuery& q) { q.head_dim = q.v_head_dim = 60; }, FusedKernel::ATen);
  add("OtherValueHeadDimStaysATen", [](KernelQuery& q) { q.v_head_dim = 128; }, FusedKernel::ATen);
  add(
      "CausalNonSquareStaysATen",
      [](KernelQuery& q) {
        q.is_causal = true;
        q.Tk = 256;
      },
      FusedKernel::ATen);
  add("Float64StaysATen", [](KernelQuery& q) { q.dtype = c10::ScalarType::Double; }, FusedKernel::ATen);
  return out;
}

class KernelChoice : public ::testing::TestWithParam<ChoiceCase> {};

TEST_P(KernelChoice, AvoidsCudnnPlansUnlessAllowed) {
  EXPECT_EQ(static_cast<int>(choose_fused_kernel(GetParam().query)), static_cast<int>(GetParam().expected));
}

INSTANTIATE_TEST_SUITE_P(Table, KernelChoice, ::testing::ValuesIn(choice_cases()),
                         [](const ::testing::TestParamInfo<ChoiceCase>& info) { return info.param.name; });

// Auto's memory of the shapes it has run: a shape is new once, repeated afterwards;
// past its capacity nothing more is recorded, so unrecorded shapes stay new (flash,
// no cuDNN plan asked for).
TEST(RepeatedShapes, NewOnceThenRepeatedWithinItsCapacity) {
  torchattn::backends::RepeatedShapes shapes(2);
  EXPECT_FALSE(shapes.seen_before({1, 2, 3}));
  EXPECT_TRUE(shapes.seen_before({1, 2, 3}));
  EXPECT_FALSE(shapes.seen_before({1, 2, 4}));
  EXPECT_FALSE(shapes.seen_before({1, 2}));
  EXPECT_FALSE(shapes.seen_before({1, 2})) << "past the capacity nothing is recorded";
  EXPECT_TRUE(shapes.seen_before({1, 2, 4}));
  EXPECT_EQ(shapes.size(), 2U);
  EXPECT_EQ(torchattn::backends::cudnn_shapes().capacity(), torchattn::backends::kMaxCudnnShapes);
}

TEST(RepeatedShapes, CountsEachShapeOnceAcrossThreads) {
  torchattn::backends::RepeatedShapes shapes(1000);
  std::atomic<int> first_calls{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int64_t i = 0; i < 200; ++i) {
        if (!shapes.seen_before({i % 50, 7})) ++first_calls;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(first_calls.load(), 50);
  EXPECT_EQ(shapes.size(), 50U);
}

TEST(EfficientBias, IsTheBoolMaskAsZeroOrMinusInfWithAlignedRows) {
  torch::manual_seed(5);
  for (int64_t Tk : {1, 15, 16, 17, 40}) {
    auto q = torch::randn({2, 3, 5, 8}, torch::kBFloat16);
    auto keep = torch::rand({2, 1, 5, Tk}) < 0.7;  // per batch, broadcast over heads
    auto bias = torchattn::backends::efficient_bias(keep, q, Tk);
    ASSERT_EQ(bias.sizes(), (std::vector<int64_t>{2, 3, 5, Tk}));
    EXPECT_EQ(bias.scalar_type(), torch::kBFloat16);
    EXPECT_EQ(bias.stride(-2) % 16, 0) << "Tk=" << Tk;
    EXPECT_EQ(bias.stride(1), 0) << "heads stay broadcast";
    auto expected =
        torch::zeros({2, 1, 5, Tk}).masked_fill(keep.logical_not(), -std::numeric_limits<float>::infinity());
    EXPECT_TRUE(torch::equal(bias.to(torch::kFloat32), expected.expand({2, 3, 5, Tk})));
  }
  // A floating mask is already additive: copied as it is.
  {
    auto q = torch::randn({2, 3, 4, 8});
    auto additive = torch::randn({2, 1, 4, 6});
    auto bias = torchattn::backends::efficient_bias(additive, q, 6);
    EXPECT_EQ(bias.stride(-2) % 16, 0);
    EXPECT_TRUE(torch::equal(bias, additive.expand({2, 3, 4, 6})));
  }
  // A [Tq, Tk] mask broadcasts over batch and heads.
  auto q = torch::randn({2, 3, 4, 8});
  auto keep = torch::tril(torch::ones({4, 6}, torch::kBool), 2);
  auto bias = torchattn::backends::efficient_bias(keep, q, 6);
  EXPECT_TRUE(torch::equal(bias[1][2], torch::zeros({4, 6}).masked_fill(keep.logical_not(), -INFINITY)));
}

TEST(FusedAttention, OnTheCpuIsATensSdpa) {
  torch::manual_seed(6);
  auto q = torch::randn({2, 2, 7, 8}), k = torch::randn({2, 2, 9, 8}), v = torch::randn({2, 2, 9, 8});
  auto keep = torch::rand({7, 9}) < 0.8;
  keep.select(1, 0).fill_(true);
  using torchattn::backends::Cudnn;
  for (Cudnn cudnn : {Cudnn::Never, Cudnn::Repeated, Cudnn::Allowed}) {
    auto got = torchattn::backends::fused_attention(q, k, v, keep, 0.0, false, std::nullopt, cudnn);
    EXPECT_TRUE(torch::equal(got, at::scaled_dot_product_attention(q, k, v, keep)));
  }
}

// The CPU causal prefill kernel: only under Backend::Auto without dropout (float32, no
// gradient, AVX2 at least: the kernel's own test), aligned bottom-right.
TEST(CausalPrefillKernel, TakesOnlyAutoWithoutDropout) {
  torch::manual_seed(8);
  const auto q = torch::randn({1, 4, 20, 16}), k = torch::randn({1, 2, 26, 16}), v = torch::randn({1, 2, 26, 16});
  const bool vector = torchattn::kernels::cpu::best_isa() >= torchattn::kernels::cpu::Isa::Avx2;
  torchattn::functional::AttentionOptions config;
  const auto out = torchattn::backends::causal_prefill_kernel(q, k, v, config);
  ASSERT_EQ(out.defined(), vector);
  if (vector) {
    // Row t sees keys 0 .. t + 6: ATen's mask of the bottom-right block.
    const auto keep = torch::ones({20, 26}, torch::kBool).tril(6);
    const auto aten = at::scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), keep);
    EXPECT_LT((out - aten).abs().max().item<float>(), 2e-6f);
  }
  config.backend = torchattn::Backend::SDPA;
  EXPECT_FALSE(torchattn::backends::causal_prefill_kernel(q, k, v, config).defined());
  config.backend = torchattn::Backend::Auto;
  config.dropout = 0.1;
  EXPECT_EQ(torchattn::backends::causal_prefill_kernel(q, k, v, config).defined(), vector);  // eval: no dropout
  config.training = true;
  EXPECT_FALSE(torchattn::backends::causal_prefill_kernel(q, k, v, config).defined());
}

// Auto takes the kernel only up to the keys where it measured faster (per instruction
// set, backends/sdpa.cpp): ATen's kernel past them.
TEST(CausalPrefillKernel, TakesAtMostTheKeysWhereItPays) {
  namespace kc = torchattn::kernels::cpu;
  EXPECT_EQ(torchattn::backends::prefill_kernel_max_keys(kc::Isa::Scalar), 0);
  EXPECT_EQ(torchattn::backends::prefill_kernel_max_keys(kc::Isa::Avx2), 512);
  EXPECT_EQ(torchattn::backends::prefill_kernel_max_keys(kc::Isa::Avx512), 16384);
  EXPECT_EQ(torchattn::backends::prefill_kernel_max_keys(kc::Isa::Avx512Vnni), 16384);
  const int64_t most = torchattn::backends::prefill_kernel_max_keys(kc::best_isa());
  torch::manual_seed(10);
  const torchattn::functional::AttentionOptions config;
  for (const int64_t T : {int64_t{8}, most, most + 1}) {
    if (T < 1) continue;
    const auto q = torch::randn({1, 2, T, 16}), k = torch::randn({1, 1, T, 16}), v = torch::randn({1, 1, T, 16});
    EXPECT_EQ(torchattn::backends::causal_prefill_kernel(q, k, v, config).defined(), T <= most) << T << " keys";
  }
}

// sdpa_attention's is_causal is ATen's, aligned top-left, also with more keys than
// queries: the bottom-right kernel stands aside there.
TEST(CausalPrefillKernel, SdpaIsCausalStaysTopLeft) {
  torch::manual_seed(9);
  const auto q = torch::randn({1, 2, 20, 16}), k = torch::randn({1, 2, 26, 16}), v = torch::randn({1, 2, 26, 16});
  const torchattn::functional::AttentionOptions config;
  const auto got = torchattn::backends::sdpa_attention(q, k, v, std::nullopt, /*is_causal=*/true, config);
  const auto aten = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
  EXPECT_LT((got - aten).abs().max().item<float>(), 2e-6f);
  const auto square = torchattn::backends::sdpa_attention(q, k.narrow(2, 0, 20), v.narrow(2, 0, 20), std::nullopt,
                                                          /*is_causal=*/true, config);
  EXPECT_LT((square - aten).abs().max().item<float>(), 2e-6f);  // top-left: the first 20 keys
}

}  // namespace

// Which fused kernel the SDPA backend calls: the decision is a pure function of
// host values, checked here on every machine; the CUDA kernels themselves run in
// the device-parametrized tests when a GPU is present.

#include "backends/sdpa.h"
#include "backends/repeated_shapes.h"

#include "common/tolerances.h"

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

}  // namespace

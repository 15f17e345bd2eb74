// The CUDA write of a static-shape KV cache (kernels/cuda/static_cache_write.h):
// against index_copy_ at the same device-side position, over dtypes, ranks 3 and 4,
// one and several new tokens, strided views of the new keys and values, positions at
// both ends; slots past the capacity are not written; and what it refuses. Built in a
// CUDA configuration only; skipped without a GPU (failing under TORCHATTN_REQUIRE_CUDA=1).

#include "common/devices.h"

#include "kernels/cuda/static_cache_write.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace {

namespace kcuda = torchattn::kernels::cuda;

class StaticCacheWrite : public ::testing::TestWithParam<torch::Dtype> {
 protected:
  void SetUp() override { devices::skip_unless_present(torch::Device(torch::kCUDA, 0)); }
};

TEST_P(StaticCacheWrite, EqualsIndexCopyAtTheDevicePosition) {
  const auto dtype = GetParam();
  const auto cuda = torch::TensorOptions().device(torch::kCUDA).dtype(dtype);
  torch::manual_seed(71);
  for (const bool rank4 : {true, false}) {
    for (const int64_t t : {1, 3}) {
      for (const int64_t p0 : {int64_t{0}, int64_t{5}, int64_t{20} - t}) {
        SCOPED_TRACE(testing::Message() << "rank " << (rank4 ? 4 : 3) << ", t " << t << ", position " << p0);
        const std::vector<int64_t> cache_shape = rank4 ? std::vector<int64_t>{2, 3, 20, 40}
                                                       : std::vector<int64_t>{2, 20, 40};
        auto keys = torch::randn(cache_shape, cuda), values = torch::randn(cache_shape, cuda);
        auto expected_k = keys.clone(), expected_v = values.clone();
        // The new keys as the attention makes them: heads transposed out of tokens.
        const auto k = rank4 ? torch::randn({2, t, 3, 40}, cuda).transpose(1, 2) : torch::randn({2, t, 40}, cuda);
        const auto v = rank4 ? torch::randn({2, t, 3, 40}, cuda).transpose(1, 2) : torch::randn({2, t, 40}, cuda);
        const auto position = torch::full({1}, p0, torch::TensorOptions().device(torch::kCUDA).dtype(torch::kLong));
        ASSERT_TRUE(kcuda::static_cache_write_applies(keys, values, k, v, position));
        kcuda::static_cache_write(keys, values, k, v, position);
        const auto index = position + torch::arange(t, position.options());
        expected_k.index_copy_(-2, index, k);
        expected_v.index_copy_(-2, index, v);
        EXPECT_TRUE(torch::equal(keys, expected_k));
        EXPECT_TRUE(torch::equal(values, expected_v));
      }
    }
  }
}

TEST_P(StaticCacheWrite, WritesNothingPastTheCapacity) {
  const auto cuda = torch::TensorOptions().device(torch::kCUDA).dtype(GetParam());
  auto keys = torch::zeros({1, 2, 8, 16}, cuda), values = torch::zeros({1, 2, 8, 16}, cuda);
  const auto k = torch::ones({1, 2, 3, 16}, cuda), v = torch::ones({1, 2, 3, 16}, cuda);
  const auto position = torch::full({1}, 7, torch::TensorOptions().device(torch::kCUDA).dtype(torch::kLong));
  kcuda::static_cache_write(keys, values, k, v, position);
  EXPECT_EQ(keys.sum().item<double>(), 2 * 16) << "only slot 7 of each head";
  EXPECT_EQ(values.narrow(2, 0, 7).abs().sum().item<double>(), 0.0);
}

INSTANTIATE_TEST_SUITE_P(Cuda, StaticCacheWrite,
                         ::testing::Values(torch::kFloat32, torch::kBFloat16, torch::kFloat16, torch::kFloat64),
                         [](const ::testing::TestParamInfo<torch::Dtype>& info) {
                           return std::string(c10::toString(info.param));
                         });

class StaticCacheWriteApplies : public ::testing::Test {
 protected:
  void SetUp() override { devices::skip_unless_present(torch::Device(torch::kCUDA, 0)); }
};

TEST_F(StaticCacheWriteApplies, RefusesWhatItCannotWrite) {
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  const auto keys = torch::zeros({1, 2, 8, 16}, cuda), values = torch::zeros({1, 2, 8, 16}, cuda);
  const auto k = torch::ones({1, 2, 1, 16}, cuda);
  const auto pos = torch::zeros({1}, cuda.dtype(torch::kLong));
  EXPECT_TRUE(kcuda::static_cache_write_applies(keys, values, k, k, pos));
  EXPECT_FALSE(kcuda::static_cache_write_applies(keys.cpu(), values.cpu(), k.cpu(), k.cpu(), pos.cpu()));
  EXPECT_FALSE(kcuda::static_cache_write_applies(keys, values, k.to(torch::kHalf), k, pos)) << "dtype";
  EXPECT_FALSE(kcuda::static_cache_write_applies(keys, values, torch::ones({1, 3, 1, 16}, cuda), k, pos)) << "heads";
  EXPECT_FALSE(kcuda::static_cache_write_applies(keys.transpose(1, 2), values.transpose(1, 2), k, k, pos))
      << "a strided cache";
  EXPECT_FALSE(kcuda::static_cache_write_applies(keys, values, k, k, pos.to(torch::kInt))) << "int32 position";
  EXPECT_FALSE(kcuda::static_cache_write_applies(keys, values, k, k, torch::zeros({2}, cuda.dtype(torch::kLong))));
  EXPECT_FALSE(kcuda::static_cache_write_applies(keys, values, k, k, pos.cpu())) << "position on the host";
}

}  // namespace

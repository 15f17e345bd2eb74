// The rotary tables a module keeps per device (block/rotary_cache.h).

#include "common/devices.h"

#include <torchattn/torchattn.h>

#include "block/rotary_cache.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>

using torchattn::RoPEOptions;

namespace {

// The tables a module uses on a device (block::RotaryCache, the path forward takes)
// equal the CPU's bit for bit: they are computed on the CPU and moved, since CUDA's
// own pow, sin and cos differ by a few ULP (about 6e-8), far above the float64 tests'
// tolerances.
class RotaryTablesOn : public ::testing::TestWithParam<torch::Device> {
 protected:
  void SetUp() override { devices::skip_unless_present(GetParam()); }
};

TEST_P(RotaryTablesOn, EqualTheCpuTablesBitForBit) {
  const torch::Device device = GetParam();
  for (const double theta : {1e4, 5e5, 1e6}) {
    for (const int64_t rot : {int64_t{64}, int64_t{32}}) {
      SCOPED_TRACE("theta " + std::to_string(theta) + " rotary_dim " + std::to_string(rot));
      const auto rope = RoPEOptions(theta).rotary_dim(rot);
      const auto [cos_cpu, sin_cpu] = torchattn::functional::rotary_tables(rope, 64, 4096);
      const torchattn::block::RotaryCache cache(rope, 64, 4096);
      const auto [cos, sin] = cache.tables(device);
      EXPECT_EQ(cos.device(), device);
      EXPECT_EQ(cos.scalar_type(), torch::kFloat32);
      EXPECT_TRUE(torch::equal(cos.cpu(), cos_cpu));
      EXPECT_TRUE(torch::equal(sin.cpu(), sin_cpu));
      // The second call returns the tables kept for the device.
      EXPECT_TRUE(cache.tables(device).first.is_same(cos));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, RotaryTablesOn, ::testing::ValuesIn(devices::all()),
                         [](const auto& info) { return devices::name(info); });

// Modules of one RoPE, head size and length share one RotaryCache (a model's layers
// hold one set of tables), held by them alone: another value of any field is another
// cache, and the last module gone takes the tables with it.
TEST(RotaryCache, ModulesOfOneShapeShareOneSetOfTables) {
  namespace B = torchattn::block;
  const RoPEOptions rope(10000.0);
  auto a = B::RotaryCache::shared(rope, 64, 128), b = B::RotaryCache::shared(rope, 64, 128);
  EXPECT_EQ(a.get(), b.get());
  EXPECT_EQ(a->tables(torch::kCPU).first.data_ptr(), b->tables(torch::kCPU).first.data_ptr());
  for (const auto& other : {B::RotaryCache::shared(RoPEOptions(5e5), 64, 128),
                            B::RotaryCache::shared(RoPEOptions(rope).interleaved(true), 64, 128),
                            B::RotaryCache::shared(RoPEOptions(rope).rotary_dim(32), 64, 128),
                            B::RotaryCache::shared(rope, 32, 128), B::RotaryCache::shared(rope, 64, 127)}) {
    EXPECT_NE(other.get(), a.get());
  }
  // Through the modules: the layers of one shape, one cache.
  torchattn::MultiHeadAttention m1(torchattn::MultiHeadAttentionOptions(64, 64, 128, 4).rope(rope));
  torchattn::MultiHeadAttention m2(torchattn::MultiHeadAttentionOptions(64, 64, 128, 4).rope(rope));
  EXPECT_EQ(B::RotaryCache::shared(rope, 16, 128).use_count(), 3);  // m1's, m2's and this one
  const std::weak_ptr<const B::RotaryCache> gone = a;
  a.reset();
  b.reset();
  EXPECT_TRUE(gone.expired());
}

}  // namespace

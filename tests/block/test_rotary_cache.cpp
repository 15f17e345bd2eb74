// The rotary tables a module keeps per device (block/rotary_cache.h).

#include "common/devices.h"

#include <torchattn/torchattn.h>

#include "block/rotary_cache.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

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

}  // namespace

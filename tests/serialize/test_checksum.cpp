// XXH64 (torchattn::xxh64): every length class of the specification and three seeds
// against the xxhash package (tests/golden/checksums.txt, tests/reference/make_golden.py);
// tensors hashed as a file stores them; the hex form and its errors.

#include "common/expect_error.h"
#include "common/golden.h"

#include <torchattn/checksum.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace {

const golden::File& checksums() {
  static const golden::File file = golden::load("checksums.txt");
  return file;
}

std::vector<uint8_t> bytes_of(const golden::Case& c) {
  const auto t = c.tensor("bytes").to(torch::kLong).contiguous();
  std::vector<uint8_t> out;
  for (int64_t i = 0; i < t.numel(); ++i) out.push_back(static_cast<uint8_t>(t.data_ptr<int64_t>()[i]));
  return out;
}

TEST(Checksum, Xxh64EqualsTheXxhashPackage) {
  int64_t cases = 0;
  for (const auto& c : checksums().cases) {
    const std::vector<uint8_t> data = bytes_of(c);
    ASSERT_EQ(static_cast<int64_t>(data.size()), c.integer("length")) << c.name;
    for (const uint64_t seed : {uint64_t{0}, uint64_t{1}, ~uint64_t{0}}) {
      EXPECT_EQ(torchattn::checksum_hex(torchattn::xxh64(data.data(), data.size(), seed)),
                c.param("xxh64_seed" + std::to_string(seed)))
          << c.name << " seed " << seed;
    }
    ++cases;
  }
  EXPECT_EQ(cases, 16);
  EXPECT_EQ(torchattn::xxh64(nullptr, 0), torchattn::xxh64("", 0));
  expect_error([] { torchattn::xxh64(nullptr, 3); }, "xxh64: expected data for 3 bytes, got a null pointer");
}

TEST(Checksum, TensorsAreHashedAsAFileStoresThem) {
  torch::manual_seed(35);
  const auto a = torch::randn({37, 19});
  const auto b = torch::randint(-128, 128, {5, 3000}, torch::kChar);
  const auto c = torch::randn({4, 6}).to(torch::kBFloat16).t();  // not contiguous
  const auto empty = torch::zeros({0, 4});
  const auto sums = torchattn::tensor_xxh64({a, b, c, empty, a});
  ASSERT_EQ(sums.size(), 5u);
  EXPECT_EQ(sums[0], torchattn::xxh64(a.data_ptr(), a.nbytes()));
  EXPECT_EQ(sums[1], torchattn::xxh64(b.data_ptr(), b.nbytes()));
  const auto cc = c.contiguous();
  EXPECT_EQ(sums[2], torchattn::xxh64(cc.data_ptr(), cc.nbytes())) << "a transposed tensor as its row-major bytes";
  EXPECT_EQ(sums[3], torchattn::xxh64(nullptr, 0));
  EXPECT_EQ(sums[4], sums[0]);
  // One changed value changes the checksum.
  auto d = a.clone();
  d[36][18] = std::nextafter(d[36][18].item<float>(), 1e9f);
  EXPECT_NE(torchattn::tensor_xxh64({d})[0], sums[0]);
  EXPECT_TRUE(torchattn::tensor_xxh64({}).empty());
  expect_error([] { torchattn::tensor_xxh64({torch::zeros({2}), torch::Tensor()}); },
               "tensor_xxh64: expected dense CPU tensors, got tensor 1 undefined");
}

TEST(Checksum, HexRoundTripsAndRefusesWhatIsNotSixteenDigits) {
  for (const uint64_t v : {uint64_t{0}, uint64_t{1}, uint64_t{0xef46db3751d8e999}, ~uint64_t{0}}) {
    const std::string hex = torchattn::checksum_hex(v);
    EXPECT_EQ(hex.size(), 16u);
    EXPECT_EQ(torchattn::checksum_from_hex(hex, "sum"), v);
  }
  EXPECT_EQ(torchattn::checksum_hex(0xef46db3751d8e999), "ef46db3751d8e999");
  for (const std::string bad : {"", "ef46db3751d8e99", "ef46db3751d8e9990", "EF46DB3751D8E999", "ef46db3751d8e99g"}) {
    expect_error([&] { torchattn::checksum_from_hex(bad, "the note's 'w'"); },
                 "the note's 'w': expected 16 lowercase hex digits (an xxh64 checksum), got '" + bad + "'");
  }
}

}  // namespace

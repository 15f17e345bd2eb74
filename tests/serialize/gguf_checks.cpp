// GgufFile (include/torchattn/gguf.h) against the gguf Python package, llama.cpp's own
// reader and writer (ctest -R gguf; tests/reference/make_gguf_reference.py writes the
// files into TORCHATTN_GGUF_REFERENCE): every tensor type torchattn reads dequantized
// to gguf's float32 bits, shapes of 1 to 4 dimensions in PyTorch's order, metadata of
// every value type, a custom alignment, and a type it does not read named.

#include "common/expect_error.h"
#include "common/int4_values.h"

#include <torchattn/gguf.h>
#include <torchattn/packed_linear.h>
#include <torchattn/safetensors.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

namespace {

std::string reference_dir() {
  const char* v = std::getenv("TORCHATTN_GGUF_REFERENCE");
  return v != nullptr ? v : "";
}

nlohmann::json expected_metadata() {
  std::ifstream in(reference_dir() + "/types_metadata.json");
  return nlohmann::json::parse(in);
}

// A GgufValue against the JSON value make_gguf_reference.py wrote.
void expect_value(const torchattn::GgufValue& v, const nlohmann::json& want, const std::string& key) {
  using Kind = torchattn::GgufValue::Kind;
  if (want.is_boolean()) {
    ASSERT_EQ(v.kind, Kind::Bool) << key;
    EXPECT_EQ(v.boolean, want.get<bool>()) << key;
  } else if (want.is_number_integer()) {
    ASSERT_EQ(v.kind, Kind::Integer) << key;
    EXPECT_EQ(v.integer, want.get<int64_t>()) << key;
  } else if (want.is_number_float()) {
    ASSERT_EQ(v.kind, Kind::Float) << key;
    EXPECT_EQ(v.number, want.get<double>()) << key;  // float32 values written exactly (0.5, 0.15625, ...)
  } else if (want.is_string()) {
    ASSERT_EQ(v.kind, Kind::String) << key;
    EXPECT_EQ(v.string, want.get<std::string>()) << key;
  } else {
    ASSERT_EQ(v.kind, Kind::Array) << key;
    ASSERT_EQ(v.array.size(), want.size()) << key;
    for (size_t i = 0; i < want.size(); ++i) expect_value(v.array[i], want[i], key + "[" + std::to_string(i) + "]");
  }
}

TEST(GgufChecks, EveryTypeDequantizesToGgufsBits) {
  ASSERT_FALSE(reference_dir().empty()) << "TORCHATTN_GGUF_REFERENCE is not set (run ctest -R gguf)";
  const auto want = expected_metadata();
  const auto reference = torchattn::load_safetensors(reference_dir() + "/types_reference.safetensors");
  for (const char* file : {"types.gguf", "aligned.gguf"}) {
    SCOPED_TRACE(file);
    const auto f = torchattn::GgufFile::open(reference_dir() + "/" + file);
    EXPECT_EQ(f.version(), 3u);
    EXPECT_EQ(f.string("general.architecture"), "llama");
    ASSERT_EQ(f.tensors().size(), reference.size());
    for (const auto& [name, expected] : reference) {
      SCOPED_TRACE(name);
      const auto* info = f.tensor(name);
      ASSERT_NE(info, nullptr);
      EXPECT_EQ(info->type, want["types"][name].get<uint32_t>());
      EXPECT_EQ(info->shape, expected.sizes().vec());
      const at::Tensor got = f.dequantize(name);
      EXPECT_EQ(got.scalar_type(), at::kFloat);
      EXPECT_TRUE(torch::equal(got, expected)) << "largest difference " << (got - expected).abs().max().item<float>();
      EXPECT_EQ(f.raw(name).numel(), static_cast<int64_t>(info->bytes));
    }
  }
  const auto aligned = torchattn::GgufFile::open(reference_dir() + "/aligned.gguf");
  EXPECT_EQ(aligned.integer("general.alignment"), 64);
  for (const auto& t : aligned.tensors()) EXPECT_EQ(t.offset % 64, 0u) << t.name;
}

// Rows of every tensor, and the 4-bit types as int4 weights, against gguf's values:
// dequantize_rows to the bit; Q4_1's int4 weights to the bit, Q4_K's within float16's
// rounding of each group's d sc and dmin m, Q6_K's as int4 quantizes its values.
TEST(GgufChecks, RowsAndInt4WeightsMatchGguf) {
  ASSERT_FALSE(reference_dir().empty()) << "TORCHATTN_GGUF_REFERENCE is not set (run ctest -R gguf)";
  const auto tensors = torchattn::load_safetensors(reference_dir() + "/types_reference.safetensors");
  const std::map<std::string, at::Tensor> reference(tensors.begin(), tensors.end());
  const auto f = torchattn::GgufFile::open(reference_dir() + "/types.gguf");
  for (const auto& [name, expected] : reference) {
    SCOPED_TRACE(name);
    const int64_t rows = expected.size(0);
    EXPECT_TRUE(torch::equal(f.dequantize_rows(name, rows / 2, rows - rows / 2),
                             expected.narrow(0, rows / 2, rows - rows / 2)));
  }
  const auto q4_1 = f.int4_weights("t.q4_1");
  EXPECT_TRUE(torch::equal(int4_values(q4_1.first, q4_1.second), reference.at("t.q4_1")));
  const auto [data, scale] = f.int4_weights("t.q4_k");
  const at::Tensor error = (int4_values(data, scale) - reference.at("t.q4_k")).abs();
  EXPECT_TRUE((error <= int4_half_rounding_bound(scale)).all().item<bool>()) << error.max();
  // Q6_K's values quantized to int4, as a layer frozen to Int4 quantizes them.
  torchattn::PackedLinear layer(torchattn::WeightFormat::Int4);
  layer.freeze({reference.at("t.q6_k")});
  const auto q6_k = f.int4_weights("t.q6_k");
  EXPECT_TRUE(torch::equal(q6_k.first, layer.frozen_weight(0).first));
  EXPECT_TRUE(torch::equal(q6_k.second, layer.frozen_weight(0).second));
}

TEST(GgufChecks, MetadataOfEveryValueType) {
  ASSERT_FALSE(reference_dir().empty());
  const auto want = expected_metadata();
  const auto f = torchattn::GgufFile::open(reference_dir() + "/types.gguf");
  for (const auto& [key, value] : want["metadata"].items()) {
    SCOPED_TRACE(key);
    const auto* v = f.find(key);
    ASSERT_NE(v, nullptr);
    expect_value(*v, value, key);
  }
  EXPECT_EQ(f.integer("test.u64"), (int64_t{1} << 62) + 5);
  EXPECT_EQ(f.number("test.u8"), 200.0);
  EXPECT_EQ(f.strings("test.strings"), (std::vector<std::string>{"a", "", "\xc4\xa0the", "\xc3\xa9"}));
  EXPECT_EQ(f.integers("test.ints"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(f.numbers("test.floats"), (std::vector<double>{0.5, -1.25}));
  expect_error([&] { f.integer("test.text"); },
               "gguf: '" + reference_dir() + "/types.gguf': key 'test.text' is string, expected an integer");
  expect_error([&] { f.string("no.such.key"); }, "has no metadata key 'no.such.key'");
  expect_error([&] { f.strings("test.ints"); }, "key 'test.ints' is an array of int32, expected strings");
  expect_error([&] { f.dequantize("no.such.tensor"); }, "has no tensor 'no.such.tensor'");
}

TEST(GgufChecks, ATypeTorchattnDoesNotReadIsNamed) {
  ASSERT_FALSE(reference_dir().empty());
  expect_error([] { torchattn::GgufFile::open(reference_dir() + "/unsupported.gguf"); },
               "': tensor 't.q5_0' has type Q5_0, which torchattn does not read (F32, F16, BF16, Q8_0, Q4_0, Q4_1, "
               "Q4_K, Q5_K, Q6_K)");
}

}  // namespace
